"""The command line's group choices and option keys, every spelling Hydra reads (`+`, `++`, `~`, null, glob(),
a sweep of recipes, --config-dir, pkg:// search paths): each composes to what the run trains, or is refused in
one line before Hydra composes it. From a break-it review of the options refactor: `~aug.name` trained the
default augmentation silently, `-m data=cifar10,cifar100 data.root=X` and `-m 'aug=glob(...)'` ended in Hydra
tracebacks, a sweep of recipes was checked against train.yaml's default options."""

from __future__ import annotations

import sys

import pytest

from vit_train.cli import arguments
from vit_train.cli.compose import composed, read, search_places, sweep_points, typed_config
from vit_train.errors import ConfigError
from vit_train.schema.config import OPTION_GROUPS
from vit_train.schema.typed import chooser


def chosen_options(args: list[str]) -> dict[str, list[str]]:
    """{group: the options the jobs of the command line `args` train}, as Hydra composes each swept value."""
    command = read(args)
    places = search_places(command.flags, command.overrides)
    found: dict[str, list[str]] = {}
    for point in sweep_points(command.overrides, places) if command.multirun else [command.overrides]:
        cfg = composed(point, places)
        for group in OPTION_GROUPS:
            name = str(cfg[group][chooser(group)])
            found.setdefault(group, []).extend([] if name in found.get(group, []) else [name])
    return found


def check_composed(args: list[str]):
    """The typed config that `--cfg job` shows for `args` (checked as a run would check it)."""
    return read([*args, "--cfg", "job"] if "--cfg" not in args else args).run.config


@pytest.mark.parametrize("args, refused", [
    (["aug=none", "~aug.name"], r"^~aug.name would leave the aug section without its option, which would silently "
                                r"become the default aug; choose the option with aug=NAME$"),
    (["~aug"], r"^~aug would leave the aug section without its option"),
    (["~data"], r"^~data would leave the data section without its option"),
    (["aug=null"], r"^aug=null would leave the aug section without its option, .*\(aug=none: no augmentation\)$"),
    (["experiment=null"], r"^experiment=null is not an option; choose one of cifar100_vit_small, "),
    (["~data.train_size", "data=cifar10"], r"^data.train_size is a key of data=shapes, not of data=cifar10"),
    (["~data.bogus"], r"^unknown config key 'data.bogus' \(data=shapes has batch_size, "),
    # a key the config has: the run would use its default while --cfg job showed it gone
    (["~seed"], r"^~seed: every key of the config has a value, so the run would train with seed's default \(0\) "
                r"while --cfg job showed it gone; give seed=VALUE to change it$"),
    (["~optim.clip_grad"], r"^~optim.clip_grad: .* with optim.clip_grad's default \(1.0\) while --cfg job"),
    (["~trainer.ema_decay"], r"^~trainer.ema_decay: .* with trainer.ema_decay's default \(null\) while"),  # a null
    (["~data.train_size"], r"^~data.train_size: .* with data.train_size's default \(10000\) while"),
    (["-m", "optim.lr=1e-3,2e-3", "~trainer.epochs"], r"^~trainer.epochs: .* trainer.epochs's default"),
    (["resume=outputs/x", "~optim.clip_grad"], r"^~optim.clip_grad: a resumed run keeps its saved config, so a key "
                                               r"cannot be deleted; give optim.clip_grad=<value> instead$"),
    (["+experiment=cifar10_vit_tiny"], r"^Multiple values for experiment.*; give the group choice without '\+': "
                                       r"experiment=cifar10_vit_tiny$"),
    (["+aug=deit"], r"; give the group choice without '\+': aug=deit$"),
    (["+experiment=cifar10_vit_tiny", "data.batch_size=5"], r"; give the group choice without '\+'"),
    (["objective=mae", "+objective.mask_ratio=0.6"], r"^\+objective.mask_ratio=0.6: objective.mask_ratio is a config "
                                                     r"key already \('\+' adds one that does not exist\); give "
                                                     r"objective.mask_ratio=0.6$"),
    (["+trainer.epochs=3"], r"^\+trainer.epochs=3: trainer.epochs is a config key already"),
    (["+data.train_size=3", "data=cifar10"], r"^data.train_size is a key of data=shapes, not of data=cifar10"),
    (["objective.alpah=0.3"], r"^unknown config key 'objective.alpah'; did you mean 'objective.alpha', a key of "
                              r"objective=distill\? \(objective=classify has name\)$"),
    (["objective=mae", "objective.mask_ration=0.5"], r"^unknown config key 'objective.mask_ration'; did you mean "
                                                     r"'objective.mask_ratio'\? \(objective=mae has decoder_depth, "),
    (["data=cifar10", "data.shufle_buffer=1"], r"did you mean 'data.shuffle_buffer', a key of data=webdataset\? "
                                               r"\(data=cifar10 has batch_size, download, "),
    (["data.rooot=/x"], r"did you mean 'data.root', a key of data=cifar10, cifar100, hf, imagefolder and webdataset\?"),
    (["data.workers=2"], r"did you mean 'data.num_workers'\? \(data=shapes has "),
    (["+foo.bar=1"], r"^unknown config key 'foo.bar': there is no section 'foo' \(sections: aug, callbacks, data, logger, model, "),
    (["-m", "experiment=cifar10_vit_tiny,cifar10_mae_pretrain", "objective.mask_ratio=0.6"],
     r"^objective.mask_ratio is a key of objective=mae, not of objective=classify"),  # the tiny recipe's job
])
def test_a_spelling_that_would_not_do_what_it_says_is_refused_in_one_line(args, refused):
    with pytest.raises(ConfigError, match=refused) as info:
        read(args)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("args, picked", [
    (["-m", "aug=glob(none,basic)"], {"aug": ["none"]}),  # Hydra's glob: include none, exclude basic
    (["-m", "aug=glob(*,exclude=[d*,t*,r*,a*])"], {"aug": ["basic", "none"]}),
    (["-m", "experiment=cifar10_vit_tiny,cifar100_vit_small", "data.root=/x"],
     {"data": ["cifar10", "cifar100"], "aug": ["autoaug"], "objective": ["classify"]}),
    (["-m", "experiment=cifar10_mae_pretrain,imagefolder_mae_pretrain", "objective.mask_ratio=0.6",
      "sweep.objective=best_loss", "sweep.direction=minimize"], {"objective": ["mae"]}),  # what MAE jobs report
    (["-m", "data=cifar10,cifar100", "data.root=/x"], {"data": ["cifar10", "cifar100"]}),
])
def test_sweeps_over_options_and_recipes_check_each_jobs_options(args, picked):
    read(args)
    chosen = chosen_options(args)
    assert {group: sorted(chosen[group]) for group in picked} == {g: sorted(v) for g, v in picked.items()}


def test_a_sweeps_option_keys_compose_whatever_the_default_option_lacks():
    """Hydra composes a sweep's command line without its swept values first: data.root on train.yaml's shapes
    stopped `-m data=cifar10,cifar100 data.root=X` with "Key 'root' is not in struct". The option sections of the
    schema's node take another option's key (each job's is checked for its own option), so these compose as given."""
    args = ["-m", "data=cifar10,cifar100", "data.root=/x", "optim.lr=1e-3", "trainer.epochs=2"]
    assert read(args).overrides == args[1:]
    assert [composed(p).data.root for p in sweep_points(args[1:], [])] == ["/x", "/x"]
    with pytest.raises(ConfigError, match=r"^optim.momentum is a key of optim=sgd, not of optim=adamw"):
        read(["-m", "optim=adamw,sgd", "optim.momentum=0.8"])  # each job's keys are its own option's
    assert composed(["data=cifar10", "data.root=/x"]).data.root == "/x"  # one run


def test_recipes_from_a_config_dir_and_a_package_search_path_are_found(tmp_path, monkeypatch):
    recipe = ("# @package _global_\ndefaults:\n  - override /objective: mae\n  - _self_\ntrainer:\n  epochs: 3\n")
    (tmp_path / "mine" / "experiment").mkdir(parents=True)
    (tmp_path / "mine" / "experiment" / "dirmae.yaml").write_text(recipe)
    (tmp_path / "pkg" / "their_configs" / "experiment").mkdir(parents=True)
    (tmp_path / "pkg" / "their_configs" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "their_configs" / "experiment" / "pkgmae.yaml").write_text(recipe)
    monkeypatch.syspath_prepend(str(tmp_path / "pkg"))
    for args in (["--config-dir", str(tmp_path / "mine"), "experiment=dirmae"],
                 [f"-cd={tmp_path / 'mine'}", "experiment=dirmae"],
                 ["hydra.searchpath=[pkg://their_configs]", "experiment=pkgmae"]):
        read([*args, "objective.mask_ratio=0.5"])
        assert chosen_options([*args, "objective.mask_ratio=0.5"])["objective"] == ["mae"]
        assert check_composed([*args, "objective.mask_ratio=0.5"]).objective.mask_ratio == 0.5
    with pytest.raises(ConfigError, match="^experiment=pkgmae is not an option"):
        read(["experiment=pkgmae"])  # without the search path


@pytest.mark.parametrize("args, refused", [
    (["model.patch_size=5"], r"^model.img_size \(32\) must be divisible by model.patch_size \(5\)$"),
    (["objective=mae", "objective.mask_ratio=1.5"], r"^objective.mask_ratio must be in \(0, 1\), got 1.5$"),
    (["trainer.epochs=${oops}"], r"^the config does not resolve: Interpolation key 'oops' not found$"),
])
def test_what_cfg_job_shows_is_checked_as_a_run_would_check_it(args, refused):
    """`vit-train model.patch_size=5 --cfg job` printed a config that every run refuses."""
    with pytest.raises(ConfigError, match=refused):
        check_composed([*args, "--cfg", "job"])


def test_cfg_job_with_minus_m_is_one_line(monkeypatch, capsys):
    from vit_train.cli import train as cli

    monkeypatch.setattr(sys, "argv", ["vit-train", "-m", "optim.lr=1,2", "--cfg", "job"])
    with pytest.raises(SystemExit) as info:
        cli.train_main()
    assert info.value.code == 2
    assert capsys.readouterr().err == ("vit-train: error: --cfg shows one run's config, not a sweep's: drop "
                                       "-m/--multirun and give each swept key one value\n")


def test_an_old_name_list_or_mapping_as_an_option_name_is_one_line():
    from vit_train.config import Config

    for name in (["shapes"], {"a": 1}):
        with pytest.raises(ConfigError, match=r"^data.name must be one of cifar10, .*; got "):
            Config.from_dict({"data": {"name": name}})
    assert arguments.group_values(arguments.read_override("aug=null"), "aug", []) == ["null"]


def test_a_section_a_config_file_renames_or_leaves_without_its_option_is_refused(tmp_path):
    """An option YAML without its `/schema/<group>/<name>` line trained the default option silently (results.json
    said classify after objective=hinge); a recipe setting data.name was refused naming a key the user never set."""
    (tmp_path / "objective").mkdir()
    (tmp_path / "objective" / "nameless.yaml").write_text("# only a comment\n")
    (tmp_path / "experiment").mkdir()
    (tmp_path / "experiment" / "renamed.yaml").write_text(
        "# @package _global_\ndata:\n  name: imagefolder\n  root: /data/x\n")
    search = f"hydra.searchpath=[file://{tmp_path}]"
    with pytest.raises(ConfigError, match=r"^objective=nameless's YAML file does not make the option: its defaults "
                                          r"list must start with `- /schema/objective/nameless`"):
        typed_config(composed(["objective=nameless"], [f"file://{tmp_path}"]), [])  # (the command line: no class)
    with pytest.raises(ConfigError, match=r"^experiment=renamed sets data.name=imagefolder over data=shapes: choose "
                                          r"the option itself, with `- override /data: imagefolder` in the recipe's "
                                          r"defaults list \(or data=imagefolder\)$"):
        check_composed(["experiment=renamed", search])
    run = read(["experiment=cifar10_mae_pretrain", "aug=none"]).run  # the recipe set aug.scale_min
    assert run.config.aug.name == "none" and run.config.objective.name == "mae"
    assert run.warnings == ["aug.scale_min=0.08 (set by experiment=cifar10_mae_pretrain) is not a key of aug=none: "
                            "ignored"]  # logged once by the run (cli/train.py `prepared`)
    with pytest.raises(ConfigError, match=r"^aug.scale_min is a key of aug="):  # given on the command line: refused
        read(["experiment=cifar10_mae_pretrain", "aug=none", "aug.scale_min=0.5"])


@pytest.mark.parametrize("edit, said", [
    (lambda c: c["data"].update(bogus=1), r"holds a config this vit-train does not read \(unknown config key "
                                          r"'data.bogus'.*\): the file was edited, or written by another version$"),
    (lambda c: c.update(objective="mae"), r"\('objective' must be a mapping, got 'mae'\): the file was edited"),
    (lambda c: c.update(mae="junk"), r"\(the saved config's 'mae' section is not a mapping, which no vit-train "
                                     r"wrote: the file was edited or damaged\)"),
    (lambda c: c.update(mae={"mask_ratio": 0.5, "bogus": 1}), r"'mae' section holds bogus, which no vit-train wrote"),
    (lambda c: c["data"].update(name="stripes"), r"was trained with data=stripes, which is not registered here: "
                                                 r"install the package that has it"),
])
def test_a_saved_config_that_this_version_cannot_read_names_the_file_and_why(edit, said):
    """Unknown keys of a saved config were dropped silently (upgrade_saved cut every section to its option's keys);
    a string section ended in a ValueError traceback; a plugin's run read without it said only 'data.name must be
    one of ...'."""
    from vit_train.config import Config

    saved = Config().to_dict()
    edit(saved)
    with pytest.raises(ConfigError, match=r"^ckpt.pt .*" + said if not said.startswith("was") else "^ckpt.pt " + said):
        Config.from_saved(saved, source="ckpt.pt")
    old = Config().to_dict()
    old["data"]["shuffle_buffer"] = 100  # the earlier layout: another option's key beside shapes' own: dropped
    assert Config.from_saved(old, source="ckpt.pt").data == Config().data


def test_cfg_job_of_a_resumed_run_shows_the_config_it_would_run(tmp_path, monkeypatch, capsys):
    """`vit-train resume=RUN --cfg job` printed train.yaml's defaults, not the run's config."""
    import yaml

    from helpers.configs import tiny_config
    from vit_train.cli import train as cli
    from vit_train.train.trainer import train as run

    run(tiny_config(aug={"name": "randaug", "randaug_n": 3}, trainer={"max_steps": 1}), tmp_path / "run")
    monkeypatch.setattr(sys, "argv", ["vit-train", f"resume={tmp_path / 'run'}", "aug.hflip=0.25", "--cfg", "job"])
    with pytest.raises(SystemExit) as info:
        cli.train_main()
    shown = yaml.safe_load(capsys.readouterr().out)
    assert info.value.code == 0
    assert (shown["aug"]["name"], shown["aug"]["randaug_n"], shown["aug"]["hflip"]) == ("randaug", 3, 0.25)
    assert (shown["data"]["train_size"], shown["resume"]) == (256, str(tmp_path / "run"))


def test_a_resumed_runs_keys_apply_in_any_order_and_an_option_switch_keeps_the_runs_own_values_of_the_keys_both_have():
    """`resume=RUN aug.hflip=0.2 aug.name=randaug` trained with hflip 0.5: the switch replaced the section after
    the key had been set, and the run's own crop_padding went back to the default."""
    from vit_train.cli.arguments import apply_overrides
    from vit_train.config import Config

    saved = Config.from_dict({"aug": {"name": "basic", "hflip": 0.1, "crop_padding": 1}}).to_dict()
    one = apply_overrides(saved, ["aug.hflip=0.2", "aug.name=randaug"])
    other = apply_overrides(saved, ["aug.name=randaug", "aug.hflip=0.2"])
    assert one == other
    assert (one["aug"]["name"], one["aug"]["hflip"], one["aug"]["crop_padding"], one["aug"]["randaug_n"]) == \
        ("randaug", 0.2, 1, 2)
    deit = apply_overrides(saved, ["aug.name=deit"])["aug"]  # basic's 0s were defaults, not the run's choices
    from vit_train.data.aug.deit import Deit
    assert deit == {**Deit.composed()["aug"], "hflip": 0.1, "crop_padding": 1}
    assert (deit["mixup_alpha"], deit["cutmix_alpha"], deit["random_erasing"], deit["label_smoothing"]) == \
        (0.8, 1.0, 0.25, 0.1)
    own = Config.from_dict({"aug": {"name": "basic", "label_smoothing": 0.2}}).to_dict()  # a choice of the run's
    assert apply_overrides(own, ["aug.name=deit"])["aug"]["label_smoothing"] == 0.2
    with pytest.raises(ConfigError, match=r"^aug.randaug_n is a key of aug=deit and randaug, not of the resumed run's "
                                          r"aug=basic; give aug.name=deit with it to change the augmentation, or drop "
                                          r"aug.randaug_n$"):
        apply_overrides(saved, ["aug.randaug_n=3"])
    with pytest.raises(ConfigError, match=r"^data.root is a key of .*, not of the resumed run's data=shapes; a resumed "
                                          r"run keeps its data: drop data.root$"):
        apply_overrides(saved, ["data.root=/x"])
    with pytest.raises(ConfigError, match=r"picks a config group, but a resumed run keeps its saved config \(to change "
                                          r"the augmentation: aug.name=deit\)"):
        apply_overrides(saved, ["aug=deit"])


@pytest.mark.parametrize("resume, spelled", [("auto", "objective=mae"), ("runs/a", "objective.name=mae")])
def test_a_refused_resume_spells_the_saved_option_as_that_command_line_takes_it(resume, spelled):
    """resume=auto composes its config from the command line, where objective.name=mae is refused as a rename: its
    advice gave that spelling, which the next command refused in turn."""
    from vit_train.config import Config
    from vit_train.errors import CheckpointError
    from vit_train.train.resume import check_compatible

    saved = Config.from_dict({"objective": {"name": "mae"}}).to_dict()
    advice = "drop the override, or give" if resume != "auto" else "give"
    with pytest.raises(CheckpointError, match=rf"resume with the saved settings \({advice} {spelled}\)"):
        check_compatible({"config": saved}, Config.from_dict({"resume": resume}), "runs/a/checkpoints/last.pt")


@pytest.mark.parametrize("overrides, advice", [
    (None, r"give model.depth=6 model.num_heads=2"),
    (["resume=auto"], r"give model.depth=6 model.num_heads=2: resume=auto composes this command's defaults, not the "
                      r"run's settings"),
    (["resume=auto", "model.depth=3", "model.num_heads=1"], r"give model.depth=6 model.num_heads=2 in place of the "
                                                            r"override"),
    (["resume=auto", "model.depth=3"], r"give model.depth=6 model.num_heads=2, in place of the override of "
                                       r"model.depth; the rest come from this command's defaults"),
    (["resume=auto", "model=vit_micro"], r"give model.depth=6 model.num_heads=2 in place of the override"),
])
def test_resume_auto_advice_says_where_a_refused_change_comes_from(overrides, advice):
    """resume=auto composes its config from the command line: dropping an override there gives the default, not the
    run's value (the advice "drop the override" was wrong twice over when the change came from the defaults)."""
    from vit_train.config import Config
    from vit_train.errors import CheckpointError
    from vit_train.train.resume import check_compatible

    saved = Config.from_dict({"model": {"depth": 6, "num_heads": 2}}).to_dict()
    given = dict(o.split("=", 1) for o in overrides or [])
    now = Config.from_dict({"resume": "auto", "model": {"depth": int(given.get("model.depth", 4)),
                                                         "num_heads": int(given.get("model.num_heads", 4))}})
    with pytest.raises(CheckpointError, match=rf"resume with the saved settings \({advice}\), or start"):
        check_compatible({"config": saved}, now, "runs/a/checkpoints/last.pt", overrides)
