"""data=webdataset, whole runs (issue 25, part A): a run killed (SIGKILL) or stopped (SIGTERM) in the middle of an
epoch and resumed equals the uninterrupted run, with 2 loader workers; 2 processes under torchrun (gloo) read each
train sample once per epoch with equal steps, and each val sample once, with fewer shards than processes x
workers and a shard count that does not divide them."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch

from helpers.configs import tiny_config
from helpers.files import assert_same_run, read_results
from helpers.kill_resume import stop_at
from helpers.runs import torchrun, vit_train
from helpers.shards import write_shards
from vit_train.errors import CheckpointError, ConfigError
from vit_train.train.trainer import train

HELPERS = Path(__file__).parents[1] / "helpers"


def sections(root: Path) -> dict:
    """4 steps of 8 per epoch (37 samples: 5 left out), 2 epochs, 2 loader workers, last.pt every step."""
    return {"data": {"name": "webdataset", "root": str(root), "batch_size": 8, "num_workers": 2, "shuffle_buffer": 6},
            "trainer": {"epochs": 2, "log_every": 1, "ckpt_every": 1}}


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    root = tmp_path_factory.mktemp("shards")
    write_shards(root, [10, 10, 10, 7], [6, 5])
    return root


@pytest.fixture(scope="module")
def reference(shards, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("reference")
    train(tiny_config(**sections(shards)), run_dir)
    return run_dir


def stopped_at(run_dir: Path, shards: Path, signal: str, row: int) -> subprocess.CompletedProcess:
    return stop_at(run_dir, sections(shards), "row", row, signal)


@pytest.mark.slow  # in the slow suite to keep `pytest` near 5 minutes on 2 cores
def test_a_run_killed_mid_epoch_resumes_as_the_uninterrupted_run(shards, reference, tmp_path):
    done = stopped_at(tmp_path, shards, "KILL", 6)  # after step 6's row: epoch 2, step 2 of 4 (last.pt of step 5)
    assert done.returncode == -9, done.stderr[-2000:]
    train(tiny_config(**sections(shards), resume="auto"), tmp_path)
    assert_same_run(tmp_path, reference)


@pytest.mark.slow
@pytest.mark.parametrize("row", [2, 7])
def test_a_run_stopped_by_sigterm_mid_epoch_resumes_as_the_uninterrupted_run(shards, reference, tmp_path, row):
    done = stopped_at(tmp_path, shards, "TERM", row)
    assert done.returncode != 0 and "ended without the fault" not in done.stdout, done.stderr[-2000:]
    train(tiny_config(**sections(shards), resume="auto"), tmp_path)
    assert_same_run(tmp_path, reference)


@pytest.mark.slow
@pytest.mark.parametrize("train_counts, workers", [([5, 3, 4], 2), ([9, 2, 6, 1, 7], 2), ([13, 11], 0)])
def test_two_processes_read_each_sample_once_per_epoch_with_equal_steps(tmp_path, train_counts, workers):
    root = tmp_path / "shards"
    write_shards(root, train_counts, [3, 4])
    spec = {"root": str(root), "out": str(tmp_path), "workers": workers, "batch": 4}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
               str(HELPERS / "stream_keys.py"), json.dumps(spec)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env={**__import__("os").environ,
                                                                                      "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    steps = sum(train_counts) // 4
    for epoch in range(2):
        assert [len(r["epochs"][epoch]) for r in ranks] == [steps, steps]  # equal steps, none runs dry
        ids = [i for r in ranks for batch in r["epochs"][epoch] for i in batch]
        assert all(len(batch) == 2 for r in ranks for batch in r["epochs"][epoch])
        assert len(ids) == steps * 4 and max(Counter(ids).values()) == 1  # each sample once, the rest left out
    assert ranks[0]["epochs"][0] != ranks[0]["epochs"][1]  # another order each epoch
    assert sorted(i for r in ranks for i in r["val"]) == list(range(7))  # every val sample once


@pytest.mark.slow
def test_torchrun_trains_on_shards_and_another_world_size_mid_epoch_is_refused_in_one_line(shards, tmp_path):
    args = ["data=webdataset", f"data.root={shards}", "data.batch_size=8", "data.num_workers=1",
            "model.embed_dim=32", "model.depth=2", "model.num_heads=2", "model.img_size=16", "trainer.device=cpu",
            "trainer.progress=false", "trainer.epochs=2"]
    done = torchrun(*args, f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert read_results(tmp_path / "run")["steps"] == 8
    cut = torchrun(*args, "trainer.max_steps=2", f"hydra.run.dir={tmp_path / 'cut'}", cwd=tmp_path)  # mid-epoch 1
    assert cut.returncode == 0, cut.stderr[-3000:]
    # one process, with the cap past the epoch's end (a cap before it adds a hint: test_webdataset_faults.py)
    alone = vit_train(f"resume={tmp_path / 'cut'}", "trainer.max_steps=8", cwd=tmp_path)
    assert alone.returncode == 2, alone.stderr[-3000:]
    assert alone.stderr.strip().splitlines()[-1].endswith(
        "cannot resume in the middle of epoch 1 (16 of its 32 images trained on): the number of processes is 1, not 2, "
        "which reorders the epoch; resume with the saved settings past the epoch's end at step 4 (it writes "
        "checkpoints/step_00000004.pt), then resume from that file with the change, or start a new run from these "
        "weights with model.pretrained=<the checkpoint>")
    assert "Traceback" not in alone.stderr


# ---- shards rewritten between a checkpoint and its resume (same total count, another layout)

def rewrite_names(root: Path) -> None:
    """The same samples in the same shards, under other file names (index.json lists the new names)."""
    index = json.loads((root / "index.json").read_text())
    for shard in index["splits"]["train"]["shards"]:
        (root / shard["name"]).rename(root / f"part-{shard['name']}")
        shard["name"] = f"part-{shard['name']}"
    (root / "index.json").write_text(json.dumps(index))


def rewritten(root: Path, change: str) -> None:
    """`root`'s 37 training samples written again in another layout, or with other class names."""
    for path in root.iterdir():
        path.unlink()
    if change == "other counts":
        write_shards(root, [12, 8, 10, 7], [6, 5])
    elif change == "other shard count":
        write_shards(root, [10, 10, 10, 5, 2], [6, 5])
    else:
        write_shards(root, [10, 10, 10, 7], [6, 5])
        if change == "other names":
            rewrite_names(root)
        elif change == "other classes":  # the same labels, other names
            index = json.loads((root / "index.json").read_text())
            (root / "index.json").write_text(json.dumps({**index, "classes": ["x", "y", "z"]}))


def run(root: Path, **trainer):
    plain = sections(root)
    plain["data"]["num_workers"] = 0
    resume = trainer.pop("resume", None)
    return tiny_config(data=plain["data"], trainer={**plain["trainer"], **trainer}, resume=resume)


@pytest.mark.parametrize("change", ["other counts", "other shard count", "other names", "other classes"])
def test_a_mid_epoch_resume_on_shards_rewritten_in_another_layout_is_refused_in_one_line(tmp_path, change):
    root = tmp_path / "shards"
    write_shards(root, [10, 10, 10, 7], [6, 5])
    train(run(root, max_steps=2), tmp_path / "run")  # stops in the middle of epoch 1
    last = tmp_path / "run" / "checkpoints" / "last.pt"
    assert len(torch.load(last, weights_only=True)["stream_layout"]["train_index"]) == 16
    rewritten(root, change)
    said = (r"^the checkpoint does not fit this data \(classes" if change == "other classes" else
            r"^cannot resume in the middle of epoch 1 \(16 of its 32 images trained on\): the training shards of "
            rf"{root} are not those the epoch began with \(index\.json lists other shard names, sample counts or "
            r"classes: fingerprint [0-9a-f]{16}, not [0-9a-f]{16}; put those shards back\), which reorders the epoch")
    with pytest.raises((ConfigError, CheckpointError), match=said) as e:
        train(run(root, resume=str(last)), tmp_path / "run")
    assert "\n" not in str(e.value)


def test_a_resume_on_the_same_shards_written_again_continues_mid_epoch(tmp_path):
    root = tmp_path / "shards"
    write_shards(root, [10, 10, 10, 7], [6, 5])
    train(run(root, max_steps=2), tmp_path / "run")
    rewritten(root, "same")  # the same layout, files written anew: the same fingerprint
    assert train(run(root, resume=str(tmp_path / "run" / "checkpoints" / "last.pt")), tmp_path / "run")["steps"] == 8


@pytest.mark.parametrize("change", ["other counts", "other names", "other classes"])
def test_at_an_epoch_boundary_another_layout_is_fine_and_other_classes_are_refused(tmp_path, change):
    root = tmp_path / "shards"
    write_shards(root, [10, 10, 10, 7], [6, 5])
    train(run(root, epochs=1), tmp_path / "run")  # ends at epoch 1's end: last.pt is at the boundary
    rewritten(root, change)
    resumed = run(root, epochs=2, resume=str(tmp_path / "run" / "checkpoints" / "last.pt"))
    if change == "other classes":
        with pytest.raises(CheckpointError, match=r"^the checkpoint does not fit this data \(classes: 3 saved") as e:
            train(resumed, tmp_path / "run")
        assert "\n" not in str(e.value)
        return
    assert train(resumed, tmp_path / "run")["steps"] == 8
