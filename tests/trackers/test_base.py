"""The tracker contract's shared parts: the flat params every tracker receives, a missing library named by its
extra, results.json's scalars, and the one-line reason a failed call is dropped with."""

from __future__ import annotations

import json
import sqlite3
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers.trackers import make_start, make_tracker

from vit_train.errors import ConfigError
from vit_train.trackers.base import flatten, reason, scalars


@dataclass
class Optim:
    lr: float = 1e-3
    betas: tuple = (0.9, 0.999)


CONFIG = {
    "seed": 0,
    "name": "",
    "tags": ["ablation", "no-ema"],
    "resume": None,
    "model": {"depth": 12, "pool": "cls", "qk_norm": False, "img_size": [32, 32]},
    "optim": Optim(),
    "data": {"root": Path("/data/x"), "extra": {}},
}


def test_flatten_gives_dotted_keys_and_scalars_only():
    assert flatten(CONFIG) == {
        "seed": 0,
        "name": "",
        "tags": '["ablation", "no-ema"]',
        "resume": None,
        "model.depth": 12,
        "model.pool": "cls",
        "model.qk_norm": False,
        "model.img_size": "[32, 32]",
        "optim.lr": 1e-3,
        "optim.betas": "[0.9, 0.999]",
        "data.root": "/data/x",
        "data.extra": "{}",
    }


def unflatten(flat: dict) -> dict:
    nested: dict = {}
    for key, value in flat.items():
        *parents, leaf = key.split(".")
        node = nested
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return nested


def test_flatten_loses_nothing_of_a_plain_config():
    plain = {"a": {"b": {"c": 1.5, "d": "x"}, "e": None}, "f": [1, 2], "g": True}
    back = unflatten(flatten(plain))
    back["f"] = json.loads(back["f"])
    assert back == plain


def test_scalars_of_results_leave_lists_and_nulls_out():
    results = {"status": "completed", "best_top1": 0.875, "steps": 40, "tags": ["a"], "error": None,
               "val_partial": False, "timing": {"wall_s": 12.5}}
    assert scalars(results) == {"status": "completed", "best_top1": 0.875, "steps": 40, "val_partial": False,
                                "timing.wall_s": 12.5}


@pytest.mark.parametrize(
    ("tracker", "hidden", "line"),
    [
        ("wandb", "wandb", "logger=wandb needs wandb: pip install 'vit-train[wandb]'"),
        ("mlflow", "mlflow", "logger=mlflow needs mlflow: pip install 'vit-train[mlflow]'"),
        # mlflow-skinny without SQLAlchemy: its default local store (SQLite) cannot open
        ("mlflow", "sqlalchemy", "logger=mlflow needs sqlalchemy: pip install 'vit-train[mlflow]'"),
    ],
)
def test_a_missing_library_is_one_line_naming_the_extra(tmp_path, monkeypatch, tracker, hidden, line):
    for name in [m for m in sys.modules if m == hidden or m.startswith(hidden + ".")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, hidden, None)  # `import hidden` now raises ImportError
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    with pytest.raises(ConfigError) as refused:
        make_tracker(tracker).start(make_start(tmp_path / "run"))
    assert str(refused.value) == line


def test_reason_is_the_innermost_cause_on_one_line():
    try:
        try:
            raise sqlite3.OperationalError("disk I/O error")
        except sqlite3.OperationalError as inner:
            raise RuntimeError("(raised as a result of autoflush)\n[SQL: INSERT ...]") from inner
    except RuntimeError as outer:
        assert reason(outer) == "OperationalError: disk I/O error"
    assert reason(ValueError("a\nb")) == "ValueError: a"


def test_importing_the_trackers_imports_neither_library():
    """The `logger=` options may import the tracker modules when a config is read: the libraries (seconds of
    import, a child process for W&B) are imported only by `start`."""
    import subprocess

    code = ("import sys, vit_train.trackers.wandb, vit_train.trackers.mlflow, vit_train.trackers.wandb_files; "
            "print(sorted(m for m in ('wandb', 'mlflow', 'torch') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
