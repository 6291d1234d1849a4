"""`name` and `tags` (every config's; recipes set a name) reach what a user reads: the run's log (train.log),
results.json and a sweep's summary.csv; a run without them says nothing more."""

from __future__ import annotations

import csv

from helpers.files import read_results
from helpers.sweep_runs import sweep
from vit_train.train.trainer import train

BASE = {"trainer": {"max_steps": 2, "eval_every": 2}, "seed": 1}


def test_a_runs_name_and_tags_are_in_its_log_and_results(tmp_path, make_config):
    train(make_config(name="baseline-7", tags=["ablation", "no-ema"], trainer={"max_steps": 2}), tmp_path / "named")
    results = read_results(tmp_path / "named")
    assert (results["name"], results["tags"]) == ("baseline-7", ["ablation", "no-ema"])
    assert "run baseline-7, tags: ablation, no-ema\n" in (tmp_path / "named" / "train.log").read_text()
    train(make_config(trainer={"max_steps": 2}), tmp_path / "plain")
    assert (read_results(tmp_path / "plain")["name"], read_results(tmp_path / "plain")["tags"]) == ("", [])
    plain_log = (tmp_path / "plain" / "train.log").read_text()
    assert "run (no name)" not in plain_log and ", tags: " not in plain_log


def test_a_sweeps_summary_lists_each_jobs_name_and_tags(tmp_path):
    sweep(tmp_path, [["name=first", "optim.lr=0.001"], ["tags=[x,y]", "optim.lr=0.0005"]], base=BASE)
    rows = {row["job"]: row for row in csv.DictReader((tmp_path / "summary.csv").open())}
    assert [(rows[j]["name"], rows[j]["tags"]) for j in "01"] == [("first", ""), ("", "x y")]
