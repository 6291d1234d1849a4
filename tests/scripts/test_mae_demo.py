"""scripts/mae_demo.py: every row of its table, and every number of table.json, is what that run's results.json
says (read back from the run directories here, not from the script's record); the labelled images of a folder of
one's own are a per-class balanced draw, linked and recorded, another for each seed. The slow tests run the whole
script with --smoke on shapes (with a recipe) and on a tiny image folder, two seeds each; the fast ones check the
table's arithmetic on made-up results and what the script refuses."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.files import read_results

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "mae_demo.py"
HEAD = ["run", "labelled images", "seed 0", "seed 1", "mean", "spread (max-min)", "over the probe (per seed)",
        "over scratch (per seed)", "wall s (all seeds)"]
SEEDS = (0, 1)


def demo(*args: str, cwd: Path, timeout: int = 900) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()


def cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.split("|")[1:-1]]


def check_the_table(out: Path, stdout: str, names: list[str], labelled: int, earlier: Path | None = None) -> dict:
    """The printed table, table.md and table.json against each run's results.json; returns table.json. `earlier`:
    the --pretrained-from folder, whose pre-training runs the table reads (not run, not printed as run)."""
    def home(s: int, name: str) -> Path:
        return (earlier if earlier and name == "pretrain" else out) / f"seed_{s}" / name

    record = json.loads((out / "table.json").read_text())
    lines = stdout.splitlines()
    start = lines.index("| " + " | ".join(HEAD) + " |")
    table = lines[start:start + 2 + len(names)]
    assert "\n".join(table) == record["table"] and (out / "table.md").read_text().startswith(record["table"] + "\n\n")
    assert lines[start + 2 + len(names)] == ""  # the table ends there: no other row
    results = {(s, name): read_results(home(s, name)) for s in SEEDS for name in names}
    assert all(r["status"] == "completed" for r in results.values())
    assert [row["name"] for row in record["rows"]] == names
    for line, row in zip(table[2:], record["rows"], strict=True):
        name = row["name"]
        metric = "final_loss" if name == "pretrain" else "final_top1"
        values = [results[s, name][metric] for s in SEEDS]
        number = "{:.4f}".format if name == "pretrain" else "{:.2f}".format
        refs = {"probe": "probe", "scratch": "recipe_scratch" if name == "recipe" else "scratch"}
        over = {key: [v - results[s, ref][metric] for s, v in zip(SEEDS, values, strict=True)] for key, ref in refs.items()}
        shown = cells(line)
        assert shown[0].startswith(row["title"]) and shown[1] == str(0 if name == "pretrain" else labelled)
        assert shown[2:6] == [number(values[0]), number(values[1]), number(statistics.fmean(values)),
                              number(max(values) - min(values))], (name, shown)
        for ref, cell in zip(("probe", "scratch"), shown[6:8], strict=True):
            expected = [] if name in ("pretrain", refs[ref]) else [f"{m:+.2f}" for m in over[ref]]
            assert cell == ", ".join(expected), (name, ref, cell)
        seconds = [record["runs"][str(s)][name]["seconds"] for s in SEEDS]
        assert shown[8] == f"{sum(seconds):.0f}"
        # table.json: the same numbers, exactly
        assert row["metric"] == metric and row["per_seed"] == values and row["seconds"] == seconds
        assert (row["mean"], row["min"], row["max"], row["spread"]) == (
            statistics.fmean(values), min(values), max(values), max(values) - min(values))
        for ref in ("probe", "scratch"):
            assert row[f"over_{ref}"] == (None if name in ("pretrain", refs[ref]) else over[ref])
        for s in SEEDS:
            assert record["runs"][str(s)][name]["results"] == results[s, name]
    # each command printed as it started, in order, as recorded; each run in its own directory
    printed = [line[2:] for line in lines if line.startswith("$ vit-train ")]
    ran = [name for name in names if not (earlier and name == "pretrain")]
    recorded = [record["runs"][str(s)][name]["command"] for s in SEEDS for name in ran]
    assert [shlex.split(p) for p in printed] == recorded
    for s in SEEDS:
        for name in names:
            assert record["runs"][str(s)][name]["command"][-1] == f"hydra.run.dir={home(s, name)}"
        if earlier:
            assert f"$ (pretrain, seed {s}: read from {home(s, 'pretrain')}, " in stdout
            assert not (out / f"seed_{s}" / "pretrain").exists()
    env = record["environment"]
    assert env["commit"] == git("rev-parse", "--short", "HEAD") + (
        " + changes" if git("status", "--porcelain", "--untracked-files=no") else "")
    import torch

    assert env["torch"] == torch.__version__ and env["cpu_count"] == os.cpu_count()
    assert re.fullmatch(rf"\d+ s wall in all; load average \(1 min\) [\d.]+ at the start, [\d.]+ at the end; "
                        rf"torch {re.escape(torch.__version__)}; .+, {os.cpu_count()} CPUs; commit "
                        rf"{re.escape(env['commit'])}" + (rf"; the pre-training runs read from {re.escape(str(earlier))} "
                        rf"\(--pretrained-from; commit {re.escape(env['commit'])}\), not run again: their wall s are "
                        rf"those they took then, the wall in all excludes them" if earlier else ""), lines[-1]), lines[-1]
    return record


def command_of(record: dict, seed: int, name: str) -> list[str]:
    return record["runs"][str(seed)][name]["command"]


@pytest.mark.slow
def test_the_smoke_run_on_shapes_tables_every_run_as_its_results_json(tmp_path):
    out = tmp_path / "demo"
    done = demo("--smoke", "--seeds", "0,1", "--out", str(out), "--recipe", "optim.layer_decay=0.75", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    names = ["pretrain", "probe", "finetune", "lp_ft", "recipe", "recipe_scratch", "scratch"]
    record = check_the_table(out, done.stdout, names, labelled=40)
    titles = [cells(line)[0] for line in record["table"].splitlines()[2:]]
    assert titles == ["MAE pre-training (256 unlabelled images; the cells: val reconstruction loss)",
                      "linear probe of the MAE encoder", "fine-tuned from the MAE encoder",
                      "LP-FT from the MAE encoder (the head alone 1 epoch, then 2 epochs)",
                      "the recipe from the MAE encoder (`optim.layer_decay=0.75`)",
                      "the recipe from scratch (`optim.layer_decay=0.75`)", "from scratch"]
    for s in SEEDS:
        encoder = f"model.pretrained={out / f'seed_{s}' / 'pretrain'}"
        finetune = command_of(record, s, "finetune")
        assert f"data.seed={s}" in finetune and f"seed={s}" in finetune and "data.train_size=40" in finetune
        assert command_of(record, s, "probe") == [
            *(a.replace("optim.lr=2e-3", "optim.lr=0.1") for a in finetune[:-1]), "model.trainable=head",
            "optim.weight_decay=0", finetune[-1].replace("finetune", "probe")]
        assert command_of(record, s, "lp_ft")[-3:-1] == ["model.lp_epochs=1", "model.lp_lr=0.1"]
        assert command_of(record, s, "scratch") == [a.replace("finetune", "scratch") for a in finetune if a != encoder]
        assert command_of(record, s, "recipe") == [*finetune[:-1], "optim.layer_decay=0.75", "trainer.max_steps=2",
                                                   finetune[-1].replace("finetune", "recipe")]
        lp_ft = read_results(out / f"seed_{s}" / "lp_ft")
        assert (lp_ft["lp_steps"], lp_ft["ft_steps"]) == (1, 2)  # 40 images in batches of 40: 1 + 2 epochs
        assert command_of(record, s, "recipe_scratch") == [a.replace("recipe", "recipe_scratch")
                                                           for a in command_of(record, s, "recipe") if a != encoder]
        assert read_results(out / f"seed_{s}" / "recipe")["steps"] == 2
        assert read_results(out / f"seed_{s}" / "pretrain")["objective"] == "mae"
    assert record["labelled_images"] is None
    # the same rows again on those encoders (--pretrained-from): no pre-training run, its rows read from `out`
    again = tmp_path / "again"
    done = demo("--smoke", "--seeds", "0,1", "--out", str(again), "--pretrained-from", str(out), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    reread = check_the_table(again, done.stdout, [n for n in names if not n.startswith("recipe")], labelled=40,
                             earlier=out)
    for s in SEEDS:
        assert reread["runs"][str(s)]["pretrain"] == {**record["runs"][str(s)]["pretrain"],
                                                      "read_from": str(out / f"seed_{s}" / "pretrain")}
        assert f"model.pretrained={out / f'seed_{s}' / 'pretrain'}" in command_of(reread, s, "finetune")


@pytest.mark.slow
def test_the_smoke_run_on_a_folder_links_a_balanced_seeded_draw_and_tables_every_run(tmp_path, image_folder):
    out = tmp_path / "demo"
    done = demo("--smoke", "--seeds", "0,1", "--out", str(out), "--folder", str(image_folder), "--labelled", "8",
                "--img-size", "16", "--patch-size", "4", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    names = ["pretrain", "probe", "finetune", "lp_ft", "scratch"]  # no --recipe, no recipe row
    record = check_the_table(out, done.stdout, names, labelled=8)
    assert cells(record["table"].splitlines()[2])[0].startswith(f"MAE pre-training (48 unlabelled images of "
                                                                f"{image_folder / 'train'};")
    draws = []
    for s in SEEDS:
        labelled = out / f"seed_{s}" / "labelled"
        links = sorted(p for p in (labelled / "train").rglob("*") if not p.is_dir())
        assert all(p.is_symlink() for p in links)
        chosen = [str(p.relative_to(labelled / "train")) for p in links]
        assert [os.readlink(p) for p in links] == [str(image_folder.resolve() / "train" / c) for c in chosen]
        counts = {cls: sum(c.startswith(cls + "/") for c in chosen) for cls in ("blue", "green", "red")}
        assert sum(counts.values()) == 8 and sorted(counts.values()) == [2, 3, 3]
        assert record["labelled_images"][str(s)] == {"seed": s, "folder": str(labelled), "per_class": counts,
                                                     "images": chosen}
        assert (labelled / "val").resolve() == (image_folder / "val").resolve()
        assert f"seed {s}: 8 labelled images of {image_folder / 'train'}" in done.stdout
        assert f"data.root={labelled}" in command_of(record, s, "probe")
        assert f"data.root={image_folder}" in command_of(record, s, "pretrain")
        draws.append(chosen)
    assert draws[0] != draws[1]  # each seed its own draw


def load_script():
    spec = importlib.util.spec_from_file_location("mae_demo", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_table_subtracts_the_probe_and_scratch_seed_by_seed():
    script = load_script()
    top1 = {"probe": (60.0, 50.5), "finetune": (70.25, 49.0), "recipe": (80.0, 81.0), "recipe_scratch": (40.0, 45.0),
            "scratch": (55.0, 52.0)}
    runs = {s: {"pretrain": {"results": {"final_loss": (0.5, 0.75)[i]}, "seconds": 10.0},
                **{name: {"results": {"final_top1": v[i]}, "seconds": 2.5} for name, v in top1.items()}}
            for i, s in enumerate(SEEDS)}
    table = script.rows(runs, list(SEEDS), 500, "10 unlabelled images", script.TITLES)
    finetune = table[2]
    assert finetune["over_probe"] == [10.25, -1.5] and finetune["over_scratch"] == [15.25, -3.0]
    assert (finetune["mean"], finetune["spread"]) == (59.625, 21.25)
    recipe, recipe_scratch = table[3], table[4]  # the recipe over its own command from scratch, not over scratch
    assert recipe["over_scratch"] == [40.0, 36.0] and recipe["over_probe"] == [20.0, 30.5]
    assert recipe_scratch["over_scratch"] == [-15.0, -7.0]
    assert table[1]["over_probe"] is None and table[5]["over_scratch"] is None and table[0]["over_probe"] is None
    text = script.markdown(table, list(SEEDS), None).splitlines()
    assert text[0] == "| " + " | ".join(HEAD) + " |"
    assert cells(text[1 + 1]) == ["MAE pre-training (10 unlabelled images; the cells: val reconstruction loss)", "0",
                                  "0.5000", "0.7500", "0.6250", "0.2500", "", "", "20"]
    assert cells(text[1 + 3]) == ["fine-tuned from the MAE encoder", "500", "70.25", "49.00", "59.62", "21.25",
                                  "+10.25, -1.50", "+15.25, -3.00", "5"]


@pytest.mark.parametrize("args, said", [
    (["--labelled", "2"], "--labelled 2 is below the 3 classes of {root}/train: a labelled run needs an image of "
                          "every class; give --labelled 3 or more"),
    (["--labelled", "51"], "--labelled 51 takes 17 images of class 'blue', which has 16 in {root}/train; give a "
                           "smaller --labelled"),
    (["--unlabelled", "100"], "--unlabelled counts shapes images; with --folder the pre-training reads every image "
                              "of DIR"),
    (["--seeds", "0,0"], "--seeds names a seed twice: [0, 0]"),
])
def test_what_the_script_refuses_is_one_line_before_any_run(tmp_path, image_folder, args, said):
    done = demo("--folder", str(image_folder), "--out", str(tmp_path / "demo"), *args, cwd=tmp_path, timeout=120)
    assert "$ vit-train" not in done.stdout and not (tmp_path / "demo" / "seed_0" / "pretrain").exists()
    assert done.returncode == 2 and done.stderr.splitlines()[-1].endswith(said.format(root=image_folder)), done.stderr


def saved_run(run_dir: Path, words: list[str], step: int = 4) -> None:
    """A made-up checkpoints/best.pt at `step` whose saved config holds `words` (hydra.* aside), as vit-train saves it."""
    import torch
    import yaml

    config: dict = {}
    for word in words:
        key, _, text = word.partition("=")
        if key.startswith("hydra."):
            continue
        *parents, last = key.split(".") if "." in key else [key, "name"] if key in ("objective", "data") else [key]
        node = config
        for part in parents:
            node = node.setdefault(part, {})
        value = yaml.safe_load(text)
        node[last] = float(value) if isinstance(value, str) and value[:1].isdigit() else value
    (run_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
    torch.save({"config": config, "step": step}, run_dir / "checkpoints" / "best.pt")


def earlier_out(tmp_path: Path, command: list[str], status: str = "completed") -> Path:
    """A made-up earlier --out whose table.json records seed 0's pre-training with `command`, and its best.pt."""
    earlier = tmp_path / "earlier"
    earlier.mkdir()
    run = {"command": ["vit-train", *command], "results": {"status": status, "final_loss": 0.5, "best_step": 4},
           "seconds": 12.0}
    (earlier / "table.json").write_text(json.dumps({"runs": {"0": {"pretrain": run}}}))
    saved_run(earlier / "seed_0" / "pretrain", command)
    return earlier


@pytest.mark.parametrize("change, said", [
    (None, "no pre-training of seed 1 there ({earlier}/seed_1/pretrain holds no run that mae_demo.py started); give the "
           "--out of an earlier run with seed 1"),
    ("data.train_size=10000", "seed 0's pre-training ran with data.train_size=10000, where this run gives "
                              "data.train_size=256; give the options that run had (--smoke, --unlabelled, "
                              "--pretrain-epochs, --folder, --img-size, --patch-size), or drop --pretrained-from"),
    ("interrupted", "seed 0's pre-training did not complete (status interrupted); run it again"),
])
def test_pretrained_from_reads_only_the_pre_training_this_run_would_give(tmp_path, monkeypatch, change, said):
    """--pretrained-from: a seed the earlier --out lacks, a pre-training of other words (another size here), or one
    that did not complete is refused in one line: the labelled rows would read another encoder silently."""
    script = load_script()
    monkeypatch.setattr(sys, "argv", ["mae_demo.py", "--smoke", "--seeds", "1" if change is None else "0"])
    args = script.parse_args()
    wanted = script.commands(args, 0, tmp_path / "now", None)["pretrain"]
    given = [w.replace("data.train_size=256", change) if change and "=" in change else w for w in wanted]
    earlier = earlier_out(tmp_path, [*given[:-1], "hydra.run.dir=elsewhere"], "interrupted" if change == "interrupted"
                          else "completed")
    seed = 1 if change is None else 0
    with pytest.raises(script.Refused) as caught:
        script.earlier_pretrain(earlier, seed, script.commands(args, seed, tmp_path / "now", None)["pretrain"])
    assert str(caught.value) == f"--pretrained-from {earlier}: " + said.format(earlier=earlier)
    if change is None:  # the same words read back, with where from
        read = script.earlier_pretrain(earlier, 0, wanted)
        assert read["seconds"] == 12.0 and read["read_from"] == str(earlier / "seed_0" / "pretrain")


def test_pretrained_from_reads_a_run_directory_where_the_earlier_script_wrote_no_table(tmp_path, monkeypatch):
    """An earlier script that stopped (a later row failed) wrote no table.json: the pre-training's run directory
    (Hydra's .hydra/overrides.yaml, results.json) is read instead, and checked the same way."""
    script = load_script()
    monkeypatch.setattr(sys, "argv", ["mae_demo.py", "--smoke"])
    args = script.parse_args()
    earlier = tmp_path / "earlier"
    wanted = script.commands(args, 0, earlier / "seed_0", None)["pretrain"]
    run = earlier / "seed_0" / "pretrain"
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "overrides.yaml").write_text("".join(f"- {w}\n" for w in wanted[:-1]))
    (run / "results.json").write_text(json.dumps({"status": "completed", "wall_seconds_all_attempts": 7.5}))
    saved_run(run, wanted)
    read = script.earlier_pretrain(earlier, 0, wanted)
    assert read["command"] == ["vit-train", *wanted] and read["seconds"] == 7.5 and read["read_from"] == str(run)
    (run / ".hydra" / "overrides.yaml").write_text("".join(f"- {w}\n" for w in wanted[:-2]))  # one word fewer
    with pytest.raises(script.Refused, match=r"ran with no schedule.warmup_epochs, where this run gives schedule.warmup_epochs=0.5;"):
        script.earlier_pretrain(earlier, 0, wanted)


@pytest.mark.parametrize("change, said", [
    ({"trainer.epochs": 2}, "trainer.epochs=2 in the checkpoint, 1 in the command"),  # resumed for longer
    ({"step": 8}, "best.pt is at step 8, the results' best at step 4"),
    ({"file": None}, "its checkpoints/best.pt cannot be read"),
])
def test_a_pre_training_changed_after_it_ran_is_refused(tmp_path, monkeypatch, change, said):
    """The weights a labelled row loads (best.pt) must be the run the record describes: one resumed for longer
    since, or rewritten, would put another encoder's numbers in the table."""
    script = load_script()
    monkeypatch.setattr(sys, "argv", ["mae_demo.py", "--smoke"])
    wanted = script.commands(script.parse_args(), 0, tmp_path / "now", None)["pretrain"]
    earlier = earlier_out(tmp_path, wanted)
    run = earlier / "seed_0" / "pretrain"
    if "file" in change:
        (run / "checkpoints" / "best.pt").unlink()
    else:
        words = [w.replace("trainer.epochs=1", "trainer.epochs=2") if "trainer.epochs" in change else w for w in wanted]
        saved_run(run, words, step=change.get("step", 4))
    with pytest.raises(script.Refused, match=rf"seed 0's pre-training in {re.escape(str(run))} changed after it ran "
                                             rf"\({re.escape(said)}.*\); the table would show another encoder's"):
        script.earlier_pretrain(earlier, 0, wanted)


def test_a_chain_of_pretrained_from_reads_the_run_that_ran(tmp_path, monkeypatch):
    """An --out made with --pretrained-from holds no pre-training run: its table records where it read one, and a
    later --pretrained-from of that --out reads there."""
    script = load_script()
    monkeypatch.setattr(sys, "argv", ["mae_demo.py", "--smoke"])
    wanted = script.commands(script.parse_args(), 0, tmp_path / "now", None)["pretrain"]
    first = earlier_out(tmp_path, wanted)
    second = tmp_path / "second"
    second.mkdir()
    record = json.loads((first / "table.json").read_text())
    record["runs"]["0"]["pretrain"]["read_from"] = str(first / "seed_0" / "pretrain")
    (second / "table.json").write_text(json.dumps(record))
    assert script.earlier_pretrain(second, 0, wanted)["read_from"] == str(first / "seed_0" / "pretrain")


@pytest.mark.parametrize("argv, said", [
    (["--recipe", "experiment=imagefolder_mae_few_labels model.pretrained=/elsewhere"], "--recipe sets model.pretrained"),
    (["--recipe", "data.root=/other seed=3"], "--recipe sets data.root"),
    (["--recipe", "hydra.run.dir=x"], "--recipe sets hydra.run.dir"),
    (["--probe-lr", "nan"], "--probe-lr must be a finite number of at least 1e-05 (the runs' schedule.min_lr), got nan"),
    (["--probe-lr", "1e-6"], "--probe-lr must be a finite number of at least 1e-05 (the runs' schedule.min_lr), got 1e-06"),
])
def test_what_the_script_sets_itself_and_a_probe_lr_it_cannot_run_are_refused(tmp_path, argv, said):
    done = demo("--out", str(tmp_path / "demo"), *argv, cwd=tmp_path, timeout=60)
    assert done.returncode == 2 and said in done.stderr.splitlines()[-1] and "$ vit-train" not in done.stdout, done.stderr


def test_the_probe_lr_is_given_exactly(tmp_path, monkeypatch):
    script = load_script()
    monkeypatch.setattr(sys, "argv", ["mae_demo.py", "--probe-lr", "0.0123456789"])
    plan = script.commands(script.parse_args(), 0, tmp_path, None)
    assert "optim.lr=0.0123456789" in plan["probe"] and "model.lp_lr=0.0123456789" in plan["lp_ft"]


@pytest.mark.parametrize("argv, extra", [
    (["--smoke"], ["data.batch_size=40", "trainer.epochs=2", "model.lp_epochs=1"]),  # 40 images; both stages
    (["--labelled", "50"], ["data.batch_size=50"]),
    ([], []),  # 500 labelled images hold the recipe's batch of 64; its own epochs
])
def test_a_recipe_with_its_own_experiment_is_fitted_to_the_labelled_images(tmp_path, monkeypatch, argv, extra):
    script = load_script()
    monkeypatch.setattr(sys, "argv", ["mae_demo.py", *argv, "--recipe", "experiment=imagefolder_mae_few_labels"])
    plan = script.commands(script.parse_args(), 0, tmp_path, None)
    recipe = plan["recipe"]
    assert recipe[recipe.index("experiment=imagefolder_mae_few_labels") + 1:-1] == extra
    assert plan["recipe_scratch"][-len(extra) - 1:-1] == extra if extra else True


def test_a_recipe_that_does_not_compose_is_one_line(tmp_path, monkeypatch):
    script = load_script()
    monkeypatch.setattr(sys, "argv", ["mae_demo.py", "--recipe", "experiment=no_such_recipe"])
    with pytest.raises(script.Refused, match=r"^--recipe experiment=no_such_recipe: .*no_such_recipe"):
        script.commands(script.parse_args(), 0, tmp_path, None)


def test_each_runs_warnings_are_shown_once(tmp_path):
    script = load_script()
    (tmp_path / "train.log").write_text("[t][INFO] fine\n[t][WARNING] the images are far smaller than the model's "
                                        "input\n[t][WARNING] the images are far smaller than the model's input\n"
                                        "[t][WARNING] LP-FT never ends\n")
    assert script.warnings_of(tmp_path) == ["the images are far smaller than the model's input", "LP-FT never ends"]
    assert script.warnings_of(tmp_path / "missing") == []


def test_a_folder_that_is_not_empty_is_refused(tmp_path):
    (tmp_path / "demo").mkdir()
    (tmp_path / "demo" / "x").write_text("")
    done = demo("--out", str(tmp_path / "demo"), cwd=tmp_path, timeout=60)
    assert done.returncode == 2 and done.stderr == f"mae_demo.py: error: {tmp_path / 'demo'} is not empty: give " \
                                                   f"another --out, or remove it\n"


@pytest.mark.parametrize("recipe, own", [("experiment=quickstart optim.layer_decay=0.75", True),
                                         ("optim.layer_decay=0.75 model.drop_path=0.1", False)])
def test_a_recipe_with_an_experiment_keeps_its_training_keys_and_one_without_adds_to_the_fine_tune(
        tmp_path, monkeypatch, recipe, own):
    """With experiment=NAME the recipe's run gets no training key of the fine-tune's (the command line would win over
    the experiment's); without one its words follow the fine-tune's command, so they win."""
    script = load_script()
    monkeypatch.setattr(sys, "argv", ["mae_demo.py", "--recipe", recipe])
    plan = script.commands(script.parse_args(), 3, tmp_path, None)
    finetune, words = plan["finetune"], shlex.split(recipe)
    assert list(plan) == ["pretrain", "probe", "finetune", "lp_ft", "recipe", "recipe_scratch", "scratch"]
    training = ["data.batch_size=64", "schedule.warmup_epochs=1", "trainer.eval_every=40", "optim.lr=2e-3",
                "trainer.epochs=40"]
    assert all(key in finetune for key in training)
    base = [a for a in finetune[:-1] if a not in training] if own else finetune[:-1]
    assert plan["recipe"] == [*base, *words, f"hydra.run.dir={tmp_path / 'recipe'}"]
    assert f"model.pretrained={tmp_path / 'pretrain'}" in base and "data.train_size=500" in base and "seed=3" in base


def test_the_commands_docs_mae_shows_for_seed_0_are_the_scripts(monkeypatch):
    """docs/mae.md's block of seed 0's commands is what `python scripts/mae_demo.py` runs (it drifted once)."""
    script = load_script()
    monkeypatch.setattr(sys, "argv", ["mae_demo.py"])
    plan = script.commands(script.parse_args(), 0, Path("outputs/mae_few_labels/seed_0"), None)
    text = (ROOT / "docs" / "mae.md").read_text()
    start = text.index("```\n", text.index("The commands of seed 0 (`--out outputs/mae_few_labels`):")) + 4
    shown = text[start:text.index("```", start)].strip().splitlines()
    assert [shlex.split(line) for line in shown] == [["vit-train", *argv] for argv in plan.values()]
