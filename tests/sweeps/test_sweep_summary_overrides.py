"""The sweep summary reads each job's overrides as Hydra recorded them, never split on spaces.

From users' reports and Hydra's grammar: a fixed value with a space (`'name=a b'`, a data.root with
a space: Hydra records `name=a\\ b`) showed up as a swept column; a quoted value holding a comma
(hydra #573), '=' (hydra #266) or '%' (hydra #962) is one value; an Optuna trial's 16-digit floats
filled the table (shortened there; summary.csv keeps them exactly, as exported numbers must be:
datarobot/syftr #112); the objective column repeated best top-1. The jobs' records here are made by
Hydra's own sweeper (`BasicSweeper.split_arguments`), so they are what a real sweep writes.
"""

import csv
import io
import json
import shlex

import pytest
import yaml
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser

from vit_train.errors import ConfigError
from vit_train.sweeps.summary import override_value, summarize, swept_keys

FIXED = ["name=a b", "data.root=/data/my images", "tags=[x,y z]",  # argv, as the shell passes them "trainer.progress=false",
         "model.pool='a,b'", "seed=3"]


def hydra_jobs(command: list[str]) -> list[list[str]]:
    """Each job's .hydra/overrides.yaml list, as Hydra's basic sweeper makes them from `command`."""
    parsed = OverridesParser.create().parse_overrides(command)
    return [job for batch in BasicSweeper.split_arguments(parsed, None) for job in batch]


def make_sweep(root, jobs: list[list[str]], top1: list[float], command: list[str] | None = None,
               losses: list[float] | None = None):
    """A sweep directory with these jobs' records and results (no training), and Hydra's multirun.yaml."""
    for i, (overrides, value) in enumerate(zip(jobs, top1)):
        job = root / str(i)
        (job / ".hydra").mkdir(parents=True)
        (job / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
        results = {"status": "completed", "best_top1": value, "final_top1": value - 1, "epochs": 1.0,
                   "images_per_s": 100.0, "wall_seconds": 2.0, "best_loss": (losses or top1)[i]}
        (job / "results.json").write_text(json.dumps(results))
    if command is not None:
        (root / "multirun.yaml").write_text(yaml.safe_dump({"hydra": {"overrides": {"task": command}}}))
    return root


def test_a_fixed_value_with_a_space_is_not_a_swept_column(tmp_path):
    command = [*FIXED, "optim.lr=1e-3,5e-4"]
    jobs = hydra_jobs(command)
    assert "name=a\\ b" in jobs[0]  # how Hydra records it
    sweep = make_sweep(tmp_path, jobs, [50.0, 60.0], command)
    summarize(sweep, out=None)
    assert (sweep / "summary.md").read_text().splitlines() == [
        "| job | status | best top-1 (objective) | final top-1 | epochs | images/s | wall s | overrides |",
        "|---|---|---|---|---|---|---|---|",
        "| 1 | completed | 60.00 | 59.00 | 1.00 | 100 | 2 | optim.lr=0.0005 |",
        "| 0 | completed | 50.00 | 49.00 | 1.00 | 100 | 2 | optim.lr=0.001 |"]


def test_without_multirun_yaml_the_values_that_differ_are_the_swept_ones(tmp_path):
    jobs = hydra_jobs([*FIXED, "data.root=/a b,/c d"])
    sweep = make_sweep(tmp_path, jobs, [50.0, 60.0])
    summarize(sweep, out=None)
    rows = (sweep / "summary.md").read_text().splitlines()[2:]
    assert [row.endswith(f"| 2 | {swept} |") for row, swept in zip(rows, ["data.root=/c\\ d", "data.root=/a\\ b"])] == [
        True, True]


def test_optuna_floats_are_short_in_the_table_and_exact_in_the_csv(tmp_path):
    """One trial (nothing to compare with): the command fixes all but Optuna's parameter."""
    trial = ["name=a\\ b", "optim.lr=0.0012345678901234567", "schedule.warmup_epochs=2.5000000000000004"]
    sweep = make_sweep(tmp_path, [trial], [71.25], ["name=a b"])
    out = io.StringIO()
    rows = summarize(sweep, out=out)
    table = (sweep / "summary.md").read_text()
    assert table.splitlines()[2] == ("| 0 | completed | 71.25 | 70.25 | 1.00 | 100 | 2 | optim.lr=0.001235 "
                                     "schedule.warmup_epochs=2.5 |")
    assert table in out.getvalue()
    with open(sweep / "summary.csv") as f:
        written = list(csv.DictReader(f))
    assert shlex.split(written[0]["overrides"]) == trial == shlex.split(rows[0]["overrides"])
    assert float(written[0]["objective"]) == 71.25


def test_a_loss_objective_has_its_own_column_and_top1_is_not_marked(tmp_path):
    jobs = hydra_jobs(["objective.mask_ratio=0.5,0.75"])
    sweep = make_sweep(tmp_path, jobs, [10.0, 20.0], ["objective.mask_ratio=0.5,0.75"], losses=[0.25, 0.125])
    summarize(sweep, "best_loss", "minimize", out=None)
    assert (sweep / "summary.md").read_text().splitlines()[:3] == [
        "| job | status | best_loss | best top-1 | final top-1 | epochs | images/s | wall s | overrides |",
        "|---|---|---|---|---|---|---|---|---|",
        "| 1 | completed | 0.1250 | 20.00 | 19.00 | 1.00 | 100 | 2 | objective.mask_ratio=0.75 |"]


def test_a_pipe_in_a_value_does_not_break_the_table(tmp_path):
    jobs = hydra_jobs(["name=a|b,c"])
    sweep = make_sweep(tmp_path, jobs, [1.0, 2.0])
    summarize(sweep, out=None)
    assert (sweep / "summary.md").read_text().splitlines()[3].endswith("| name=a\\|b |")


@pytest.mark.parametrize("text, value", [
    ("a\\ b", "a b"), ("'a b'", "a b"), ("'a,b'", "a,b"), ("'x=y'", "x=y"), ("/p/%r.bin", "/p/%r.bin"),
    ("False", False), ("false", False), ("null", None), ("1e-3", 0.001), ("0.001", 0.001), ("4", 4),
    ("[a, b\\ c]", "[a,b c]"), ("[a,b c]", "[a,b c]")])
def test_override_values_read_as_hydra_reads_them(text, value):
    assert override_value(text) == value and type(override_value(text)) is type(value)


def test_a_command_value_equal_to_the_jobs_is_fixed_however_it_is_written():
    jobs = [["trainer.progress=False", "name=a\\ b", "optim.lr=0.001"]]
    assert swept_keys(jobs, ["trainer.progress=false", "name=a b", "optim.lr=1e-3"]) == set()
    assert swept_keys(jobs, ["trainer.progress=false", "name=a b", "optim.lr=1e-3,5e-4"]) == {"optim.lr"}
    assert swept_keys(jobs, None) == {"trainer.progress", "name", "optim.lr"}  # one job, no command: all


def test_a_partial_validations_score_is_marked_in_the_summary(tmp_path):
    """trainer=debug jobs (trainer.limit_val_batches) were ranked on 256 val images without a word."""
    import json

    from vit_train.sweeps.summary import summarize

    for job, (top1, partial) in enumerate([(14.45, True), (12.0, False)]):
        (tmp_path / str(job) / ".hydra").mkdir(parents=True)
        (tmp_path / str(job) / ".hydra" / "overrides.yaml").write_text(f"- optim.lr={job + 1}e-3\n")
        (tmp_path / str(job) / "results.json").write_text(json.dumps(
            {"status": "completed", "best_top1": top1, "final_top1": top1, "best_partial": partial,
             "val_partial": partial, "epochs": 1, "images_per_s": 1.0, "wall_seconds": 1.0}))
    rows = summarize(tmp_path)
    table = (tmp_path / "summary.md").read_text()
    assert "| 0 | completed | 14.45* | 14.45* |" in table and "| 1 | completed | 12.00 | 12.00 |" in table, table
    assert "\\* on a partial validation (trainer.limit_val_batches)" in table
    with open(tmp_path / "summary.csv") as f:
        assert [(r["job"], r["best_partial"]) for r in csv.DictReader(f)] == [("0", "True"), ("1", "False")]
    assert [r["job"] for r in rows] == ["0", "1"]


@pytest.mark.parametrize("trained, key, refused", [
    ("classify", "best_loss", "give --objective best_top1"), ("mae", "best_top1", "give --objective best_loss"),
    ("classify", "best_top1", None), ("mae", "best_loss", None), ("distill", "final_top1", None)])
def test_a_key_no_job_reports_is_refused_naming_one_they_do(tmp_path, trained, key, refused):
    """vit-sweep-summary --objective best_loss of a classification sweep wrote an empty column and exit 0."""
    sweep = make_sweep(tmp_path, hydra_jobs(["optim.lr=1e-3,5e-4"]), [10.0, 20.0])
    for job in ("0", "1"):
        results = json.loads((sweep / job / "results.json").read_text())
        (sweep / job / "results.json").write_text(json.dumps({**results, "objective": trained}))
    if refused is None:
        rows = summarize(sweep, key, "maximize", out=None)
        assert [r["objective"] for r in rows] == [read[key] for read in (
            json.loads((sweep / r["job"] / "results.json").read_text()) for r in rows)]
        return
    with pytest.raises(ConfigError, match=rf"report .* not {key}: {refused}$"):
        summarize(sweep, key, "maximize", out=None)
    assert not (sweep / "summary.csv").exists()


def test_a_sweep_of_an_objective_not_registered_here_is_refused_and_its_summary_kept(tmp_path, capsys):
    """Without the package of the sweep's objective, vit-sweep-summary re-sorted by best_top1 and rewrote summary.md
    and summary.csv with empty columns, exit 0."""
    from vit_train.sweeps.summary import main

    sweep = make_sweep(tmp_path, hydra_jobs(["optim.lr=1e-3,5e-4"]), [10.0, 20.0])
    for job in ("0", "1"):
        results = json.loads((sweep / job / "results.json").read_text())
        (sweep / job / "results.json").write_text(json.dumps({**results, "objective": "hinge", "best_error": 3.0}))
    (sweep / "summary.md").write_text("the sweep's own table\n")
    with pytest.raises(ConfigError, match=r"^jobs of .* were trained with objective=hinge, which is not registered "
                                          r"here; install the package that has it"):
        summarize(sweep, "best_top1", "maximize", out=None)
    (sweep / "multirun.yaml").write_text(yaml.safe_dump({"sweep": {"objective": "best_error", "direction": "minimize"}}))
    with pytest.raises(SystemExit) as info:
        main([str(sweep)])
    assert info.value.code == 2
    assert capsys.readouterr().err.startswith(f"vit-sweep-summary: error: {sweep} was swept by sweep.objective="
                                              f"best_error, which no objective here reports")
    assert (sweep / "summary.md").read_text() == "the sweep's own table\n" and not (sweep / "summary.csv").exists()
