"""Every key of the chosen group option is settable (a shared section's under every option, a data, aug or
objective option's own keys under that option); a key of another option is refused in one line naming
the option that has it; the typed schema is the one source of defaults; a key the chosen options
ignore (a shared section's, read or not by what else is chosen) gets one warning line."""

import dataclasses
import types
import typing

import pytest
from omegaconf import OmegaConf

from helpers.configs import TINY, composed, config_dir
from helpers.runs import vit_train
from vit_train.cli.arguments import option_of_choice
from vit_train.cli.compose import read
from vit_train.cli.commands import group_file
from vit_train.config import Config
from vit_train.errors import ConfigError
from vit_train.schema.config import OPTION_GROUPS, ignored_keys, override_keys
from vit_train.schema.typed import option_class

CONFIGS = config_dir()
SECTIONS = ("model", "data", "aug", "optim", "schedule", "trainer", "objective")
OPTIONS = [(group, path.stem) for group in SECTIONS for path in sorted((CONFIGS / group).glob("*.yaml"))]
NEEDS = {("data", "imagefolder"): ["data.root=/x"], ("data", "webdataset"): ["data.root=/x"],
         ("data", "hf"): ["data.root=/x"], ("objective", "distill"): ["objective.teacher=t.pt"]}


def section_class(group: str, option: str) -> type:
    """The dataclass of `group`'s section when `option` is chosen: the option's own for an option group (for the
    model group, the family its preset names)."""
    if group not in OPTION_GROUPS:
        return type(getattr(Config(), group))
    return option_class(group, option_of_choice(group, option, [CONFIGS]))


def defaults(group: str, option: str) -> dict:
    return dataclasses.asdict(section_class(group, option)())


def other_value(tp, default):
    """A valid value of type `tp` that differs from `default`, and its command-line spelling."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):  # Optional[int] and int | None
        inner = [a for a in args if a is not type(None)][0]
        return other_value(inner, None if default is None else default) if default is not None else \
            other_value(inner, object())
    if origin is typing.Literal:
        value = next(a for a in args if a != default)
        return value, str(value)
    if origin is list:
        return ([0.8, 0.95], "[0.8,0.95]") if args[0] is float else (["a", "b"], "[a,b]")
    if tp is bool:
        return (not default), str(not default).lower()
    if tp is int:
        value = 7 if default != 7 else 5
        return value, str(value)
    if tp is float:
        value = 0.375 if default != 0.375 else 0.25
        return value, str(value)
    return "some_text", "some_text"


@pytest.mark.parametrize("group, option", OPTIONS)
def test_every_key_of_the_chosen_option_is_settable(group, option):
    cls = section_class(group, option)
    hints = typing.get_type_hints(cls)
    wanted, args = {}, [f"{group}={option}"]
    for f in dataclasses.fields(cls):
        if f.name == getattr(cls, "chooser", "name"):
            continue
        wanted[f.name], text = other_value(hints[f.name], defaults(group, option)[f.name])
        args.append(f"{group}.{f.name}={text}")
    read(["--help", *args])  # the command line's checks and Hydra's composition (the values are not a run's: unchecked)
    got = composed(args)[group]
    assert {k: got[k] for k in wanted} == wanted
    if group != "model":  # a model preset's name is a label, set above like any key
        assert got.get("name", option) == option  # the trainer section has no name


def test_the_reported_command_composes_with_its_values():
    """`vit-train aug=autoaug aug.mixup_alpha=0.8 aug.cutmix_alpha=1.0 aug.switch_prob=0.3` failed with
    Hydra's 'not in struct' once; batch mixing is every aug option's."""
    cfg = Config.from_dict(composed(["aug=autoaug", "aug.mixup_alpha=0.8", "aug.cutmix_alpha=1.0",
                                     "aug.switch_prob=0.3", "optim=sgd", "optim.momentum=0.8"]))
    assert (cfg.aug.name, cfg.aug.mixup_alpha, cfg.aug.cutmix_alpha, cfg.aug.switch_prob) == ("autoaug", 0.8, 1.0, 0.3)
    assert cfg.optim.momentum == 0.8 and ignored_keys(cfg) == []


@pytest.mark.parametrize("args, line", [
    (["data=shapes", "data.bad_images=error"], "data.bad_images is a key of data=hf, imagefolder and webdataset, "
                                                "not of data=shapes (its keys: batch_size, eval_batch_size, num_workers, "
                                                "pipeline, repeated_aug, train_size, val_size, seed); pick one of data=hf, imagefolder, "
                                                "webdataset or drop data.bad_images"),
    (["data=cifar10", "data.train_size=500"], "data.train_size is a key of data=shapes, not of data=cifar10"),
    (["aug=basic", "aug.randaug_m=12"], "aug.randaug_m is a key of aug=deit and randaug, not of aug=basic"),
    (["aug=none", "aug.hflip=0.4"], "aug.hflip is a key of aug=autoaug, basic, deit, randaug and trivial, not of aug=none"),
    (["objective.mask_ratio=0.5"], "objective.mask_ratio is a key of objective=mae, not of objective=classify"),
    (["experiment=cifar10_vit_tiny", "data.shuffle_buffer=8"], "data.shuffle_buffer is a key of data=webdataset, not "
                                                               "of data=cifar10"),  # the recipe's choice
    (["-m", "data=shapes,cifar10", "data.root=x"], "data.root is a key of data=cifar10"),  # one job would lack it
    (["data.nonsense=1"], "unknown config key 'data.nonsense'"),
    (["data.name=cifar10"], "'data.name=cifar10' renames the data section but keeps the option's keys; choose the "
                            "option with data=cifar10"),  # Hydra #2670: `app.db=mysql` meant app/db=mysql
    # model, optim and schedule: each option owns its keys (a ResNet carried 14 ViT keys it never read)
    (["model=resnet18", "model.depth=3"], "model.depth is a key of model.arch=vit, not of model.arch=resnet18 (its "
                                          "keys: name, img_size, patch_size, pretrained, reset_head); pick "
                                          "a model of model.arch=vit or drop model.depth"),
    (["optim=adamw", "optim.momentum=0.5"], "optim.momentum is a key of optim=sgd, not of optim=adamw"),
    (["optim=sgd", "optim.betas=[0.8,0.9]"], "optim.betas is a key of optim=adamw, not of optim=sgd"),
    (["schedule=constant", "schedule.min_lr=0.0"], "schedule.min_lr is a key of schedule=cosine, not of "
                                                   "schedule=constant"),
    (["model.arch=resnet18"], "'model.arch=resnet18' changes the model family but keeps the preset's keys; choose a "
                              "preset of model.arch=resnet18 with model=NAME (resnet18)"),
    (["-m", "data=shapes,cifar10", "objective.name=mae"], "'objective.name=mae' renames the objective section"),
])
def test_a_key_of_another_option_is_refused_in_one_line_naming_the_option_that_has_it(args, line):
    with pytest.raises(ConfigError) as refused:
        read(args)
    assert str(refused.value).startswith(line) and "\n" not in str(refused.value), refused.value


def test_a_dict_with_a_key_of_another_option_is_refused_the_same_way():
    with pytest.raises(ConfigError, match="^data.shuffle_buffer is a key of data=webdataset, not of data=shapes"):
        Config.from_dict({"data": {"shuffle_buffer": 8}})
    with pytest.raises(ConfigError, match="^aug.randaug_n is a key of aug=deit and randaug, not of aug=autoaug"):
        Config.from_dict({"aug": {"name": "autoaug", "randaug_n": 3}})


@pytest.mark.parametrize("group, option", OPTIONS)
def test_option_files_set_only_what_differs_from_the_schema(group, option):
    plain = OmegaConf.to_container(OmegaConf.load(CONFIGS / group / f"{option}.yaml")) or {}
    plain.pop("defaults", None)
    same = [k for k, v in plain.items() if k != "name" and v == defaults(group, option)[k]]
    assert same == [], f"{group}/{option}.yaml repeats the schema's defaults for {same}"


@pytest.mark.parametrize("group, option", OPTIONS + [("experiment", p.stem) for p in (CONFIGS / "experiment").glob("*.yaml")])
def test_no_option_or_recipe_sets_a_key_it_ignores(group, option):
    extra = ["data.root=/somewhere"] if option.startswith(("imagenet", "imagefolder")) else []
    extra += ["objective.teacher=t.pt"] if option.endswith("distilled") else []
    cfg = Config.from_dict(composed([f"{group}={option}", *extra, *NEEDS.get((group, option), [])]))
    assert ignored_keys(cfg) == []
    for name, section in cfg.sections().items():  # every key a section says it ignores is one of its own
        assert {key for key, _, _ in section.ignored(cfg)} <= {f.name for f in dataclasses.fields(section)}, name


@pytest.mark.parametrize("overrides, warned", [
    (["optim=sgd", "optim.momentum=0.5"], []),
    (["aug=deit", "aug.randaug_m=12"], []),
    (["aug=basic", "aug.mixup_alpha=0.2", "aug.switch_prob=0.3"],
     ["aug.switch_prob=0.3 has no effect with aug.mixup_alpha=0.2, aug.cutmix_alpha=0.0"]),
    (["aug=basic", "aug.mixup_alpha=0.2", "aug.cutmix_alpha=1.0", "aug.switch_prob=0.3"], []),
    (["data=imagefolder", "data.root=/x", "aug.crop_padding=2"],
     ["aug.crop_padding=2 has no effect with aug=basic, data=imagefolder; it applies only to data=cifar10, cifar100, shapes"]),
    (["data=imagefolder", "data.root=/x", "aug.scale_min=0.2"], []),
    (["data=cifar10", "aug.scale_min=0.2"], ["aug.scale_min=0.2 has no effect with aug=basic, data=cifar10; it applies "
                                             "only to data=hf, imagefolder, webdataset"]),
    (["trainer.compile_mode=max-autotune"], ["trainer.compile_mode=max-autotune has no effect with trainer.compile=false"]),
    (["trainer.compile_scope=step", "trainer.compile_backend=aot_eager"],
     ["trainer.compile_scope=step has no effect with trainer.compile=false",
      "trainer.compile_backend=aot_eager has no effect with trainer.compile=false"]),
    (["trainer.compile=true", "trainer.compile_scope=step"], []),
    (["model=resnet18", "model.patch_size=8"], ["model.patch_size=8 has no effect with model.arch=resnet18"]),
    (["model=resnet18"], []),  # the data set's patch size, which every model's section holds, is not said
    (["objective=mae", "aug.label_smoothing=0.1"], ["aug.label_smoothing=0.1 has no effect with objective=mae (it "
                                                    "reads no labels); it applies only to objectives trained on labels"]),
    (["objective=distill", "objective.teacher=t.pt", "model.distilled=true", "objective.tau=3"],
     ["objective.tau=3.0 has no effect with objective.type=hard; it applies only to objective.type=soft"]),
    (["objective=distill", "objective.teacher=t.pt", "model.distilled=true", "objective.type=soft",
      "objective.tau=3"], []),
])
def test_a_key_the_chosen_option_ignores_gets_one_warning(overrides, warned):
    lines = ignored_keys(Config.from_dict(composed(overrides)), override_keys(overrides))
    assert len(lines) == len(warned), lines
    for line, start in zip(lines, warned):
        assert line.startswith(start) and "\n" not in line


def test_vit_eval_group_switch_gives_the_whole_section():
    assert group_file("data", "cifar10") == {"name": "cifar10", "batch_size": 128, "eval_batch_size": None,
                                             "num_workers": 4, "pipeline": "auto", "repeated_aug": 1, "root": "data",
                                             "download": True}


@pytest.mark.slow  # in the slow suite to keep `pytest` near 5 minutes on 2 cores
def test_the_warning_is_in_a_real_runs_log(tmp_path):
    done = vit_train(*TINY, "trainer.max_steps=1", "trainer.compile_mode=max-autotune", "aug=autoaug",
                     "aug.switch_prob=0.3", f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    said = "trainer.compile_mode=max-autotune has no effect with trainer.compile=false; it applies only to " \
           "trainer.compile=true"
    assert said in done.stdout and "aug.switch_prob=0.3 has no effect" in done.stdout
    logged = (tmp_path / "run" / "train.log").read_text()
    assert f"][WARNING] {said}\n" in logged
    assert "warning: " not in done.stdout and "] warning: " not in logged  # the level says it, once
