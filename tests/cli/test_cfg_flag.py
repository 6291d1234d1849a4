"""Every spelling Hydra accepts for its flags means the same to vit-train: `--cfg job`, `--cfg=job`, `-c job` and
`-cjob` print the same config, before or after the overrides; with `resume=RUN` it is the resumed run's config (its
checkpoint's with the overrides on top), not what the command line alone composes; with `-m` every spelling is the
same one line. And Hydra itself, through the schema's structured configs, refuses a value of the wrong type: one
line, exit 2, no traceback."""

from __future__ import annotations

import sys

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.errors import ConfigCompositionException
from omegaconf.errors import ValidationError

from helpers.configs import TINY
from helpers.runs import vit_train
from vit_train.cli.train import train_main
from vit_train.config import config_dir

SPELLINGS = [["--cfg", "job"], ["--cfg=job"], ["-c", "job"], ["-cjob"]]


def cli(args: list[str], monkeypatch, capsys) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of `vit-train ARGS`, in this process."""
    GlobalHydra.instance().clear()
    monkeypatch.setattr(sys, "argv", ["vit-train", *args])
    try:
        train_main()
        code = 0
    except SystemExit as e:
        code = e.code or 0
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A run of the tiny model (depth 2, width 32) that stopped after one step, with its checkpoint."""
    home = tmp_path_factory.mktemp("runs")
    done = vit_train(*TINY, "trainer.max_steps=1", f"hydra.run.dir={home / 'run'}", cwd=home)
    assert done.returncode == 0, done.stderr
    return home / "run"


def test_every_spelling_of_cfg_job_prints_the_same_config(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    shown = set()
    for flag in SPELLINGS:
        for args in ([*flag, "model=vit_micro", "trainer.epochs=3"], ["model=vit_micro", "trainer.epochs=3", *flag]):
            code, out, err = cli(args, monkeypatch, capsys)
            assert code == 0 and err == "", (args, err)
            shown.add(out)
    (out,) = shown
    assert "epochs: 3" in out and "embed_dim: 64" in out
    assert not (tmp_path / "outputs").exists()


def test_every_spelling_of_cfg_job_with_resume_prints_the_resumed_runs_config(finished_run, tmp_path, monkeypatch,
                                                                                capsys):
    monkeypatch.chdir(tmp_path)
    before = sorted(p.name for p in finished_run.rglob("*"))
    shown = set()
    for flag in SPELLINGS:
        for args in ([*flag, f"resume={finished_run}", "trainer.max_steps=6"],
                     [f"resume={finished_run}", "trainer.max_steps=6", *flag]):
            code, out, err = cli(args, monkeypatch, capsys)
            assert code == 0 and err == "", (args, err)
            shown.add(out)
    (out,) = shown
    assert "max_steps: 6" in out and "embed_dim: 32" in out and "depth: 2" in out  # the checkpoint's model
    assert f"resume: {finished_run}" in out
    code, fresh, _ = cli(["--cfg", "job", "trainer.max_steps=6"], monkeypatch, capsys)
    assert code == 0 and "embed_dim: 32" not in fresh  # what the command line alone composes: not the run's
    assert sorted(p.name for p in finished_run.rglob("*")) == before and not (tmp_path / "outputs").exists()


def test_every_spelling_of_cfg_job_with_minus_m_is_the_same_one_line(finished_run, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    line = ("vit-train: error: --cfg shows one run's config, not a sweep's: drop -m/--multirun and give each swept "
            "key one value\n")
    for flag in SPELLINGS:
        for multirun in ("-m", "--multirun"):
            for args in ([multirun, *flag, "optim.lr=1e-3,5e-4"], [*flag, "optim.lr=1e-3,5e-4", multirun],
                         [multirun, *flag, f"resume={finished_run}"]):
                assert cli(args, monkeypatch, capsys) == (2, "", line), args
    assert not (tmp_path / "outputs").exists()


def test_hydra_itself_refuses_a_value_of_the_wrong_type():
    """The schema is Hydra's structured config: Hydra's own composition refuses the value (OmegaConf's
    ValidationError), with no check of vit-train's in between."""
    import vit_train.cli.nodes  # noqa: F401 (the schema's nodes in ConfigStore)

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
        for override in ("trainer.epochs=abc", "model.depth=1.5", "optim.lr=fast", "trainer.compile=maybe"):
            with pytest.raises(ConfigCompositionException) as info:
                compose("train", overrides=[override])
            assert isinstance(info.value.__cause__, ValidationError), override
        assert compose("train", overrides=["trainer.epochs=7"]).trainer.epochs == 7


@pytest.mark.parametrize("args, line", [
    (["trainer.epochs=abc"], "trainer.epochs must be an integer, got 'abc' (str)"),
    (["--cfg=job", "trainer.epochs=abc"], "trainer.epochs must be an integer, got 'abc' (str)"),
    (["-m", "trainer.epochs=3,abc"], "trainer.epochs must be an integer, got 'abc' (str)"),
    (["model.depth=1.5"], "model.depth must be an integer, got 1.5 (float)"),
])
def test_a_wrongly_typed_value_is_one_line_exit_2(args, line, tmp_path):
    done = vit_train(*args, cwd=tmp_path)
    assert (done.returncode, done.stderr) == (2, f"vit-train: error: {line}\n")
    assert "Traceback" not in done.stdout and not (tmp_path / "outputs").exists()


@pytest.mark.parametrize("args, refused", [
    (["--package", "model"], r"^--package model picks the part of the config --cfg shows: give it with --cfg job$"),
    (["-p", "model", "trainer.epochs=2"], r"^--package model picks the part"),  # Hydra ignored it and trained
    (["-m", "resume=runs/a", "trainer.max_steps=5"], r"^resume=runs/a continues one run in its own directory, not a "
                                                     r"sweep: drop -m \(a sweep's unfinished jobs resume when"),
    (["hparams_search=optuna", "resume=runs/a"], r"^resume=runs/a continues one run .* drop hparams_search"),
])
def test_a_flag_that_would_train_otherwise_than_it_says_is_one_line(args, refused):
    """`--package` without --cfg (Hydra ignores it: the command trained the default run), `-m resume=RUN` (a job
    trained the run again in the sweep's folder, without its best.pt, then the sweep exited 2)."""
    from vit_train.cli.compose import read
    from vit_train.errors import ConfigError

    with pytest.raises(ConfigError, match=refused):
        read(args)
