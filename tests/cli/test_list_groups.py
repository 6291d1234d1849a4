"""The list groups logger=[...] and callbacks=[...] on the command line (Hydra's "Selecting multiple configs from
a Config Group", as lightning-hydra-template's logger= and callbacks= groups): what each list composes to, each
chosen option's keys under its name, checked like every option's (one line naming the key), a key of an option
the list does not choose refused with the list to give; old commands unchanged (logger=[tensorboard]); on
resume=PATH another list may be chosen, its keys the saved ones."""

from __future__ import annotations

import json

import pytest

from helpers.configs import TINY
from helpers.in_process import run_main
from vit_train.cli.compose import read
from vit_train.errors import ConfigError


def check_composed(args: list[str]):
    return read([*args, "--cfg", "job"]).run.config


@pytest.mark.parametrize("args, logger, callbacks", [
    ([], ["tensorboard"], []),  # an old command: TensorBoard as before, no callbacks
    (["logger=[]"], [], []),
    (["logger=[tensorboard]", "callbacks=[early_stopping]"], ["tensorboard"], ["early_stopping"]),
    (["callbacks=[early_stopping]", "callbacks.early_stopping.patience=7", "callbacks.early_stopping.target=80"],
     ["tensorboard"], ["early_stopping"]),
])
def test_a_list_composes_to_its_options_each_under_its_name(args, logger, callbacks):
    cfg = check_composed(args)
    assert list(cfg.logger) == logger and list(cfg.callbacks) == callbacks
    if "callbacks.early_stopping.patience=7" in args:
        stopper = cfg.callbacks["early_stopping"]
        assert (stopper.patience, stopper.target, stopper.min_delta, stopper.mode) == (7, 80.0, 0.0, "auto")


@pytest.mark.parametrize("args, line", [
    (["callbacks.early_stopping.patience=5"],
     "callbacks.early_stopping.patience is a key of callbacks option early_stopping, which callbacks=[] does not "
     "choose; add it to the list: callbacks=[early_stopping]"),
    (["logger=[]", "callbacks=[]", "callbacks.early_stopping.min_delta=1"],
     "callbacks.early_stopping.min_delta is a key of callbacks option early_stopping, which callbacks=[] does not "
     "choose; add it to the list: callbacks=[early_stopping]"),
    (["callbacks=[early_stopping]", "callbacks.early_stopping.patiense=5"],
     "unknown config key 'callbacks.early_stopping.patiense'; did you mean 'callbacks.early_stopping.patience'? "
     "(keys of 'callbacks.early_stopping': monitor, mode, patience, min_delta, target)"),
    (["callbacks=[early_stopping]", "callbacks.early_stopping.patience=abc"],
     "callbacks.early_stopping.patience must be an integer, got 'abc' (str)"),
    (["callbacks=[early_stopping]", "callbacks.early_stopping.mode=up"],
     "callbacks.early_stopping.mode must be one of auto, max, min; got 'up'"),
    (["callbacks=[early_stopping]", "callbacks.early_stopping.patience=0"],
     "callbacks.early_stopping.patience must be > 0, got 0"),
    (["logger=[tensorboard,wandb]", "logger.wandb.mode=onlin"],  # accepted, then W&B refused it at start: no W&B data
     "logger.wandb.mode must be one of offline, online, disabled; got 'onlin'"),
    (["logger=[mlflow]", "logger.mlflow.experiment_nme=x"],
     "unknown config key 'logger.mlflow.experiment_nme'; did you mean 'logger.mlflow.experiment_name'? (keys of "
     "'logger.mlflow': tracking_uri, experiment_name)"),
    (["logger=[nope]"], "logger=nope is not an option; choose one of mlflow, tensorboard, wandb"),
    (["callbacks=[early_stopping,nope]"], "callbacks=nope is not an option; choose one of early_stopping"),
    (["logger.nope.x=1"], "logger.nope.x: logger has no option 'nope' (its options: mlflow, tensorboard, wandb)"),
    (["logger=[]", "trainer.viz_every=1"],
     "trainer.viz_every draws its figures in TensorBoard, which logger= leaves out: add tensorboard to the list "
     "(logger=[tensorboard,...]) or set trainer.viz_every=null"),
])
def test_a_key_or_choice_refused_in_one_line(args, line):
    with pytest.raises(ConfigError) as e:
        check_composed(args)
    assert str(e.value) == line


@pytest.mark.slow
def test_on_resume_another_list_may_be_chosen_and_an_unchosen_options_key_is_refused(tmp_path, monkeypatch, capsys):
    from vit_train.cli.train import train_main

    run = tmp_path / "run"
    first = [*TINY, "trainer.max_steps=2", f"hydra.run.dir={run}", "callbacks=[early_stopping]",
             "callbacks.early_stopping.patience=9"]
    status, out, err = run_main(train_main, monkeypatch, capsys, *first, prog="vit-train")
    assert status == 0, err
    saved = check_composed([f"resume={run}"])
    assert list(saved.callbacks) == ["early_stopping"] and saved.callbacks["early_stopping"].patience == 9
    again = check_composed([f"resume={run}", "logger=[]", "callbacks=[early_stopping]"])
    assert list(again.logger) == [] and again.callbacks["early_stopping"].patience == 9  # its saved keys
    dropped = check_composed([f"resume={run}", "callbacks=[]"])
    assert dict(dropped.callbacks) == {}
    with pytest.raises(ConfigError) as e:
        check_composed([f"resume={run}", "callbacks=[]", "callbacks.early_stopping.patience=3"])
    assert str(e.value) == ("callbacks.early_stopping.patience is a key of callbacks option early_stopping, which "
                            "the resumed run's callbacks=[] does not choose; add it to the list: "
                            "callbacks=[early_stopping]")
    more = [f"resume={run}", "trainer.max_steps=4", "logger=[]"]
    status, out, err = run_main(train_main, monkeypatch, capsys, *more, prog="vit-train")
    assert status == 0, err
    assert json.loads((run / "results.json").read_text())["steps"] == 4
