"""A new option is one module and one YAML, shown: a data set (data=stripes) and an objective
(objective=hinge) written outside vit_train as a user writes their own (tests/helpers/toy_options.py,
copied into a temporary folder beside one YAML file per option). Importing the module registers both;
nothing of vit_train names them. Together they compose, train, resume bit for bit, evaluate, and appear
in results.json and the sweep summary under their own keys; the command line refuses a key of another
option, and the slow test does all of it through the real commands.
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers.configs import composed
from helpers.files import assert_identical, logged, read_results, summary_tables
from helpers.registry import registry_kept
from helpers.sweep_runs import sweep
from vit_train.cli.compose import read
from vit_train.cli.train import register_options
from vit_train.config import Config
from vit_train.errors import ConfigError
from vit_train.schema.typed import REGISTRY
from vit_train.train.trainer import train

HELPERS = Path(__file__).resolve().parents[1] / "helpers"
PACKAGE = Path(__file__).resolve().parents[2]
TINY = ["model.embed_dim=32", "model.depth=2", "model.num_heads=2", "model.img_size=16", "data.batch_size=16",
        "trainer.device=cpu", "trainer.progress=false", "trainer.epochs=2", "trainer.log_every=1"]
YAML = {"data/stripes.yaml": "# Horizontal or vertical stripes, 2 classes, generated (my_options.py).\n"
                             "defaults:\n  - /schema/data/stripes\n  - _self_\n",
        "objective/hinge.yaml": "# The multi-class hinge loss, scored by the val error (my_options.py).\n"
                                "defaults:\n  - /schema/objective/hinge\n  - _self_\n",
        "objective/brier.yaml": "defaults:\n  - /schema/objective/brier\n  - _self_\n",
        "model/tinycnn.yaml": "# A small CNN (my_options.py).\ndefaults:\n  - /schema/model/tinycnn\n  - _self_\n"
                              "name: tinycnn\n"}
EXACT_KEYS = ("model", "optimizer", "scheduler", "epoch", "step", "batch_in_epoch", "best_score", "best_metric", "rng")


@pytest.fixture
def mine(tmp_path):
    """The user's folder: my_options.py and configs/<group>/<option>.yaml, the module imported (registering its
    options, and their Hydra nodes); unregistered again after the test."""
    folder = tmp_path / "mine"
    folder.mkdir()
    shutil.copy(HELPERS / "toy_options.py", folder / "my_options.py")
    for name, text in YAML.items():
        (folder / "configs" / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / "configs" / name).write_text(text)
    sys.path.insert(0, str(folder))
    with registry_kept():
        try:
            importlib.import_module("my_options")
            register_options()
            yield folder
        finally:
            sys.path.remove(str(folder))
            sys.modules.pop("my_options", None)


def args_of(mine: Path, *extra: str) -> list[str]:
    return ["data=stripes", "objective=hinge", f"hydra.searchpath=[file://{mine / 'configs'}]", *TINY, *extra]


def test_nothing_of_vit_train_names_the_new_options():
    names = ("stripes", "hinge", "Stripes", "Hinge")
    found = [str(p.relative_to(PACKAGE)) for folder in ("vit_train", "configs") for p in (PACKAGE / folder).rglob("*")
             if p.is_file() and p.suffix in (".py", ".yaml") and any(n in p.read_text() for n in names)]
    assert found == []


def test_a_second_option_of_the_same_name_is_refused_not_silently_swapped(mine):
    """A registry that keeps the last class of a name would train on another data set than the one named."""
    from dataclasses import dataclass

    from vit_train.data.sources.base import DataSource

    with registry_kept():
        with pytest.raises(ConfigError, match=r"^data=cifar10 is vit_train.data.sources.cifar.Cifar10 already; give "
                                              r".*\.Impostor another name$"):
            @dataclass
            class Impostor(DataSource):
                name: str = "cifar10"
        assert REGISTRY["data"]["cifar10"].__module__ == "vit_train.data.sources.cifar"


def test_the_new_options_compose_with_their_own_keys_and_refuse_another_options(mine):
    args = args_of(mine, "objective.margin=0.5", "data.stripe_width=3")
    read(args)  # what the command line checks before Hydra reads it
    plain = composed(args)
    assert plain["data"] == {"name": "stripes", "batch_size": 16, "eval_batch_size": None, "num_workers": 0,
                             "pipeline": "auto", "repeated_aug": 1, "train_size": 64, "val_size": 32, "stripe_width": 3}
    assert plain["objective"] == {"name": "hinge", "margin": 0.5}
    cfg = Config.from_dict(plain)
    assert (type(cfg.data).__name__, type(cfg.objective).__name__, cfg.model.img_size) == ("Stripes", "Hinge", 16)
    with pytest.raises(ConfigError, match="^data.train_size is a key of data=shapes and stripes, not of data=cifar10"):
        read(["data=cifar10", "data.train_size=9"])
    with pytest.raises(ConfigError, match="^objective.margin is a key of objective=hinge, not of objective=classify"):
        Config.from_dict({"objective": {"margin": 0.5}})
    with pytest.raises(ConfigError, match="^data.stripe_width must be > 0, got 0$"):
        Config.from_dict(composed(args_of(mine, "data.stripe_width=0")))


def test_the_new_options_train_resume_bit_for_bit_evaluate_and_report_their_own_numbers(mine, tmp_path):
    from vit_train.tools.report import evaluate_checkpoint, evaluation_text

    cfg = Config.from_dict(composed(args_of(mine, "trainer.ckpt_every=1", "trainer.keep_last=100",
                                            "model.drop_path=0.1")))
    full = tmp_path / "full"
    results = train(cfg, full)
    assert (results["objective"], results["status"], results["steps"]) == ("hinge", "completed", 8)
    assert {"best_error", "final_error"} <= set(results) and "best_top1" not in results and "final_loss" not in results
    assert 0 <= results["best_error"] <= results["final_error"] <= 100
    losses = {row["step"]: row["loss"] for row in logged(full, "train")}
    resumed = tmp_path / "resumed"  # from the middle of the first epoch (4 steps each)
    again = train(Config.from_dict({**cfg.to_dict(), "resume": str(full / "checkpoints" / "step_00000003.pt")}),
                  resumed)
    expected, got = (torch.load(run / "checkpoints" / "last.pt", weights_only=True) for run in (full, resumed))
    for key in EXACT_KEYS:
        assert_identical(expected[key], got[key], key)
    assert {row["step"]: row["loss"] for row in logged(resumed, "train")} == {s: v for s, v in losses.items() if s > 3}
    assert {k: again[k] for k in ("best_error", "final_error", "best_step")} == \
        {k: results[k] for k in ("best_error", "final_error", "best_step")}
    report = evaluate_checkpoint(full / "checkpoints" / "last.pt", attention_images=0, progress=False)
    assert report["objective"] == "hinge" and report["error"] == pytest.approx(results["final_error"])
    assert evaluation_text(report, "last.pt") == f"last.pt: val error {report['error']:.2f}%"


def test_a_sweep_of_the_new_options_is_summarised_by_their_own_numbers(mine, tmp_path):
    base = {"data": {"name": "stripes", "batch_size": 16}, "objective": {"name": "hinge"},
            "trainer": {"max_steps": 2, "epochs": 1}}
    values = sweep(tmp_path / "sweep", [["objective.margin=0.5"], ["objective.margin=2.0"]], base, "best_error",
                   "minimize")
    assert all(0 <= v <= 100 for v in values)
    csv_rows, table = summary_tables(tmp_path / "sweep")
    assert [row["best_error"] for row in sorted(csv_rows, key=lambda r: r["job"])] == [str(v) for v in values]
    assert table[0][:4] == ["job", "status", "best error (objective)", "final error"]
    assert sorted(row[0] for row in table[2:-1]) == ["0", "1"]  # the header, its rule, the rows, the notes


def test_an_objective_of_only_what_it_must_define_trains_resumes_evaluates_and_is_summarised(mine, tmp_path):
    """objective=brier defines metric, build_model, build_loss and evaluate; the base's defaults give the rest
    (results.json's best_brier and final_brier, the closing line, vit-eval's text, the sweep summary's columns).
    An objective written from docs/extending.md's list once ended in a NotImplementedError traceback."""
    from vit_train.tools.report import evaluate_checkpoint, evaluation_text

    args = [a.replace("objective=hinge", "objective=brier") for a in args_of(mine)]
    cfg = Config.from_dict(composed([*args, "trainer.ckpt_every=1", "trainer.keep_last=100"]))
    full = tmp_path / "full"
    results = train(cfg, full)
    assert (results["objective"], results["status"], results["steps"]) == ("brier", "completed", 8)
    scores = [row["brier"] for row in logged(full, "val")]
    assert (results["best_brier"], results["final_brier"]) == (min(scores), scores[-1])
    assert f"completed: best brier {results['best_brier']:.4f} (step {results['best_step']})" in \
        (full / "train.log").read_text()
    resumed = tmp_path / "resumed"
    again = train(Config.from_dict({**cfg.to_dict(), "resume": str(full / "checkpoints" / "step_00000005.pt")}),
                  resumed)
    expected, got = (torch.load(run / "checkpoints" / "last.pt", weights_only=True) for run in (full, resumed))
    for key in EXACT_KEYS:
        assert_identical(expected[key], got[key], key)
    assert {k: again[k] for k in ("best_brier", "final_brier")} == {k: results[k] for k in ("best_brier", "final_brier")}
    report = evaluate_checkpoint(full / "checkpoints" / "last.pt", attention_images=0, progress=False)
    assert report["brier"] == pytest.approx(results["final_brier"])
    assert evaluation_text(report, "last.pt").splitlines() == ["last.pt", f"brier {report['brier']:.4f}"]
    brier = REGISTRY["objective"]["brier"]
    original = brier.inference_model
    try:  # an error of the objective's own code is raised as it is, not called a damaged file
        brier.inference_model = lambda *args: (_ for _ in ()).throw(NotImplementedError("inference_model"))
        with pytest.raises(NotImplementedError, match="^inference_model$"):
            evaluate_checkpoint(full / "checkpoints" / "last.pt", attention_images=0, progress=False)
    finally:
        brier.inference_model = original
    base = {"data": {"name": "stripes", "batch_size": 16}, "objective": {"name": "brier"},
            "trainer": {"max_steps": 2, "epochs": 1}}
    sweep(tmp_path / "sweep", [["optim.lr=0.001"], ["optim.lr=0.002"]], base, "best_brier", "minimize")
    csv_rows, table = summary_tables(tmp_path / "sweep")
    assert table[0][:4] == ["job", "status", "best brier (objective)", "final brier"]
    assert all(float(row["best_brier"]) >= 0 for row in csv_rows)


@pytest.mark.parametrize("group, base, missing", [
    ("objective", "vit_train.objectives.base:Objective", "metric, build_model, build_loss, evaluate"),
    ("data", "vit_train.data.sources.base:DataSource", "splits"),
    ("aug", "vit_train.data.aug.base:Augmentation", "train_transform"),
])
def test_an_option_short_of_its_groups_contract_is_refused_in_one_line_when_chosen(group, base, missing):
    """Not a traceback from the middle of a run (flops_per_image, inference_model: NotImplementedError)."""
    from dataclasses import dataclass

    module, _, name = base.partition(":")
    with registry_kept():
        Short = dataclass(type("Short", (getattr(importlib.import_module(module), name),),
                               {"__annotations__": {"name": str}, "name": "short", "__module__": "theirs"}))
        assert REGISTRY[group]["short"] is Short
        with pytest.raises(ConfigError, match=rf"^{group}=short \(theirs.Short\) does not define {missing}, which every "
                                              rf"{group} option defines; add (it|them) \(docs/extending.md\)$"):
            Config.from_dict({group: {"name": "short"}})


def test_a_registered_option_without_its_yaml_and_a_yaml_without_its_class_are_named(mine):
    """`data=stripes` without the folder of its YAML was "not an option", after another message had said
    "pick data=stripes"; a YAML file whose module was not imported names the entry-point group."""
    with pytest.raises(ConfigError, match=r"^data=stripes \(my_options.Stripes\) has no data/stripes.yaml in the config "
                                          r"folders; give the folder that holds it: hydra.searchpath="):
        read(["data=stripes"])
    (mine / "configs" / "data" / "ghost.yaml").write_text("name: ghost\n")
    with pytest.raises(ConfigError, match=r"^data=ghost has a YAML file but no class: its module was not imported "
                                          r"\(name it in the entry-point group vit_train.options"):
        read(["data=ghost", "data.batch_size=8", f"hydra.searchpath=[file://{mine / 'configs'}]"])


def installed(mine: Path) -> dict[str, str]:
    """The environment of a process in which the user's module is an installed package's: a dist-info on the path
    whose entry point in the group vit_train.options names it (what `pip install` of their package leaves)."""
    info = mine / "my_options-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: my-options\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[vit_train.options]\nmine = my_options\n")
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(mine), os.environ.get("PYTHONPATH", "")]),
            "PYTHONUNBUFFERED": "1"}


NEEDY = """from dataclasses import dataclass, field
from vit_train.data.sources.shapes import Shapes
from vit_train.data.aug.basic import Basic

@dataclass(kw_only=True)
class Waves(Shapes):
    name: str = "waves"
    freq: int

@dataclass
class Mine(Basic):
    name: str = "mine"
    default = True

@dataclass
class Weighted(Shapes):
    name: str = "weighted"
    weights: dict[str, float] = field(default_factory=lambda: {"a": 1.0})
    sizes: tuple[int, int] = (1, 2)
"""


@pytest.mark.parametrize("module, said", [
    ("raise ImportError('needs a module that is not installed')\n",
     ["the options of their_options (entry point theirs of vit_train.options, package their-options 0.1) are not "
      "available: ImportError: needs a module that is not installed"]),
    (NEEDY, ["data=waves (their_options.Waves) is not available: its class cannot be made from its defaults "
             "(TypeError: Waves.__init__() missing 1 required keyword-only argument: 'freq'); give every key a default",
             "aug=mine (their_options.Mine) is not available: it sets default = True, but the default aug is "
             "vit-train's; drop that line"]),
], ids=["import-error", "no-default"])
@pytest.mark.slow  # two commands, each starting Python and torch
def test_a_package_whose_options_cannot_be_used_is_one_line_and_the_rest_works(tmp_path, module, said):
    """Another package's broken module, or an option of it that cannot be made from its defaults, does not stop
    vit-train (a required field once broke every command, --help included): one warning line names it, it is not
    there, the built-in options (and that package's sound ones: dict and tuple keys) are."""
    folder = tmp_path / "broken"
    folder.mkdir()
    (folder / "their_options.py").write_text(module)
    info = folder / "their_options-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: their-options\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[vit_train.options]\ntheirs = their_options\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(folder), os.environ.get("PYTHONPATH", "")])}
    shown = subprocess.run([sys.executable, "-m", "vit_train", "--cfg", "job"], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=600)
    assert shown.returncode == 0 and "name: shapes" in shown.stdout, shown.stderr
    for line in said:
        assert (shown.stdout + shown.stderr).count(line) == 1, shown.stderr
    if module is NEEDY:  # the sound option of that package is there, with its dict and tuple keys
        weighted = subprocess.run([sys.executable, "-m", "vit_train", "data=weighted", "data.sizes=[3,4]", "--cfg",
                                   "job"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
        *warned, refused = weighted.stderr.splitlines()  # the two warnings above, then one line of refusal
        assert weighted.returncode == 2 and warned == said, weighted.stderr
        assert refused.startswith("vit-train: error: data=weighted (their_options.Weighted) has no data/weighted.yaml"), \
            weighted.stderr  # registered: only its YAML missing


@pytest.mark.slow  # five commands, each starting Python and torch
def test_the_real_commands_take_the_new_options_of_an_installed_package(mine, tmp_path):
    env = installed(mine)

    def run(*args: str, entry: str = "vit_train") -> subprocess.CompletedProcess:
        module = ["-m", "vit_train"] if entry == "vit_train" else \
            ["-c", f"from vit_train.cli.commands import {entry}_main as m; m()"]
        return subprocess.run([sys.executable, *module, *args], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=600)

    shown = run(*args_of(mine), "--cfg", "job")
    assert shown.returncode == 0 and "stripe_width: 2" in shown.stdout and "margin: 1.0" in shown.stdout, shown.stderr
    refused = run(*args_of(mine), "data.shuffle_buffer=4")
    assert refused.returncode == 2 and refused.stderr.startswith("vit-train: error: data.shuffle_buffer is a key of "
                                                                 "data=webdataset, not of data=stripes"), refused.stderr
    trained = run(*args_of(mine), f"hydra.run.dir={tmp_path / 'run'}")
    assert trained.returncode == 0, trained.stderr
    results = read_results(tmp_path / "run")
    assert results["objective"] == "hinge" and results["best_error"] is not None
    evaluated = run(f"ckpt={tmp_path / 'run'}", "attention.images=0", "progress=false", "--json", entry="eval")
    assert evaluated.returncode == 0, evaluated.stderr
    assert json.loads(evaluated.stdout)["error"] == pytest.approx(results["best_error"])  # a run directory: best.pt
    swept = run("-m", *args_of(mine), "objective.margin=0.5,2.0", "sweep.objective=best_error",
                "sweep.direction=minimize", "trainer.max_steps=2", f"hydra.sweep.dir={tmp_path / 'sweep'}")
    assert swept.returncode == 0, swept.stderr
    assert "best error (objective)" in (tmp_path / "sweep" / "summary.md").read_text()


def test_a_model_family_of_ones_own_trains_resumes_bit_for_bit_evaluates_exports_and_is_known_by_its_weights(
        mine, tmp_path):
    """model=tinycnn (model.arch=tinycnn, my_options.py): one module and one YAML. Its keys are its own (a ViT's are
    refused); it trains on shapes, resumes from the middle of an epoch bit for bit, evaluates, exports to safetensors
    and ONNX (equal logits), and the door for weights knows it from its tensors: another width is refused by name."""
    from vit_train.objectives.weights_in import load_pretrained
    from vit_train.tools.export import export
    from vit_train.tools.inference import load_for_inference
    from vit_train.tools.report import evaluate_checkpoint

    args = ["model=tinycnn", f"hydra.searchpath=[file://{mine / 'configs'}]", "data.train_size=128", "data.val_size=32",
            "data.batch_size=16", "trainer.device=cpu", "trainer.progress=false", "trainer.epochs=2",
            "trainer.log_every=1", "trainer.ckpt_every=1", "trainer.keep_last=100"]
    with pytest.raises(ConfigError, match="^model.depth is a key of model.arch=vit, not of model.arch=tinycnn"):
        read([*args, "model.depth=3"])
    cfg = Config.from_dict(composed(args))
    assert (type(cfg.model).__name__, cfg.model.width, cfg.model.name) == ("TinyCNN", 8, "tinycnn")
    full = tmp_path / "full"
    results = train(cfg, full)
    assert results["status"] == "completed" and results["steps"] == 16 and results["final_top1"] is not None
    again = train(Config.from_dict({**cfg.to_dict(), "resume": str(full / "checkpoints" / "step_00000005.pt")}),
                  tmp_path / "resumed")
    expected, got = (torch.load(run / "checkpoints" / "last.pt", weights_only=True) for run in (full, tmp_path / "resumed"))
    for key in EXACT_KEYS:
        assert_identical(expected[key], got[key], key)
    assert again["final_top1"] == results["final_top1"]
    assert expected["identity"]["architecture"] == {"model.arch": "tinycnn", "model.width": 8}
    report = evaluate_checkpoint(full / "checkpoints" / "last.pt", attention_images=0, progress=False)
    assert report["top1"] == pytest.approx(results["final_top1"])
    trained = load_for_inference(full / "checkpoints" / "last.pt")
    assert export(trained, "onnx", tmp_path / "tiny.onnx").get("max_abs_diff", 0.0) < 1e-4
    assert export(trained, "safetensors", tmp_path / "tiny.safetensors")["format"] == "safetensors"
    wider = Config.from_dict(composed([*args, "model.width=12"]))
    with pytest.raises(ConfigError, match=r"model.width=8 \(here 12\)"):
        load_pretrained(wider.model.build(10), str(full / "checkpoints" / "last.pt"), None, False)


@pytest.mark.parametrize("spelled", ["full", "architecture only"])
def test_a_resumed_run_of_ones_own_family_with_an_architecture_field_changed_is_one_line_naming_it(
        mine, tmp_path, monkeypatch, caplog, spelled):
    """A family that lists only ARCHITECTURE (as docs/extending.md's minimum) is refused on resume as one that also
    gives refused_on_resume and NO_FIT: the key, both values, why, and a new run from scratch (model.pretrained
    refuses those weights too), not torch's load_state_dict error cut at its first line."""
    from vit_train.errors import CheckpointError
    from vit_train.train.resume import check_compatible

    family = sys.modules["my_options"].TinyCNN
    if spelled == "architecture only":
        monkeypatch.setattr(family, "refused_on_resume", family.__mro__[1].refused_on_resume)
        monkeypatch.setattr(family, "NO_FIT", ("arch",))
        monkeypatch.setattr(family, "flops_per_image", family.__mro__[1].flops_per_image)  # none: the page's minimum
    args = ["model=tinycnn", f"hydra.searchpath=[file://{mine / 'configs'}]", "data.train_size=32", "data.val_size=16",
            "data.batch_size=16", "trainer.device=cpu", "trainer.progress=false", "trainer.max_steps=1"]
    import logging

    with caplog.at_level(logging.INFO, logger="vit_train"):
        train(Config.from_dict(composed(args)), tmp_path / "run")
    unknown = "FLOPs per image unknown (model.arch=tinycnn defines no flops_per_image): no TFLOP/s or MFU logged"
    assert (unknown in caplog.messages) == (spelled == "architecture only")  # the family's to define, not classify's
    ckpt = torch.load(tmp_path / "run" / "checkpoints" / "last.pt", weights_only=True)
    wider = Config.from_dict(composed([*args, "model.width=12"]))
    with pytest.raises(CheckpointError) as refused:
        check_compatible(ckpt, wider, "last.pt")
    why = ("the weights have another shape" if spelled == "full"
           else "model.width is an architecture field of model.arch=tinycnn: the checkpoint's weights are another "
                "network's")
    assert str(refused.value) == (
        f"cannot resume last.pt with a changed config (model.width: 8 -> 12): {why}; resume with the saved settings "
        f"(drop the override, or give model.width=8), or start a new run from scratch with the change (model.width: "
        f"the checkpoint's weights do not fit the new architecture, so model.pretrained=last.pt would not load them "
        f"either) (see docs/resuming.md)")
