"""How a run ends when something fails, and who may write its directory: the run-directory lock
held by `train()` itself (free and held, under the command line's lock, rank 0 only), a sweep job
refusing a directory in use, a full disk recorded in train.log and results.json, train.log's
handler removed after any failure, and TensorBoard holding each step once whatever its files'
names."""

import errno
import logging
import math
import os
import re
import shutil

import pytest
import torch

import vit_train.checkpoint as checkpoint_module
import vit_train.train.trainer as trainer_module
from helpers.configs import tiny_config
from helpers.files import assert_same_run, file_bytes, model_weights, read_results, tb_scalars
from helpers.runs import hold_lock, lock_is_free
from vit_train.outputs import rundir
from vit_train.errors import CheckpointError, DataError, OutputError
from vit_train.outputs.rundir import RunDirBusy
from vit_train.sweeps.job import run_job
from vit_train.train.trainer import train

SHORT = {"trainer": {"max_steps": 2, "log_every": 1}}


# ---------------------------------------------------------------- the lock, from train() itself


@pytest.mark.slow  # in the slow suite to keep `pytest` near 5 minutes on 2 cores
def test_train_holds_its_directory_for_the_whole_run_and_frees_it_at_the_end(tmp_path, monkeypatch):
    seen = []
    real_save = trainer_module.save

    def save(run, best=False):  # at each checkpoint, another process tries to take the directory
        seen.append(lock_is_free(tmp_path))
        real_save(run, best)

    monkeypatch.setattr(trainer_module, "save", save)
    train(tiny_config(trainer={"max_steps": 2, "ckpt_every": 1}), tmp_path)
    assert seen == [False, False]
    assert lock_is_free(tmp_path)


def test_train_into_a_directory_another_process_holds_raises_and_touches_nothing(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"split": "train", "step": 1, "loss": 2.0}\n')
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "last.pt.tmp").write_bytes(b"PK being written by the holder")
    holder = hold_lock(tmp_path)
    try:
        before = file_bytes(tmp_path)
        with pytest.raises(RunDirBusy, match=rf"is in use by another vit-train run \(pid {holder.pid} on "):
            train(tiny_config(**SHORT, resume="auto"), tmp_path)
        assert file_bytes(tmp_path) == before
        assert not [h for h in logging.getLogger("vit_train").handlers if isinstance(h, logging.FileHandler)]
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.slow  # in the slow suite to keep `pytest` near 5 minutes on 2 cores
def test_under_the_command_lines_lock_train_neither_locks_twice_nor_lets_go(tmp_path):
    lock = rundir.acquire(tmp_path)  # what the CLI's Hydra callback does before the run
    try:
        train(tiny_config(**SHORT), tmp_path, lock=lock)
        assert not lock_is_free(tmp_path) and lock.fd >= 0
    finally:
        lock.release()
    assert lock_is_free(tmp_path)


@pytest.mark.slow  # in the slow suite to keep `pytest` near 5 minutes on 2 cores
def test_only_rank_0_takes_the_lock(tmp_path, monkeypatch):
    """Under torchrun rank 0 holds the directory for every process: another rank must not try to
    take it (it would find it held by rank 0 and stop)."""
    holder = hold_lock(tmp_path)  # rank 0, say
    try:
        monkeypatch.setenv("RANK", "1")
        train(tiny_config(**SHORT), tmp_path)
        monkeypatch.setenv("RANK", "0")
        with pytest.raises(RunDirBusy):
            train(tiny_config(**SHORT, resume="auto"), tmp_path)
    finally:
        holder.kill()
        holder.wait()


# ---------------------------------------------------------------- a sweep job and a directory in use


@pytest.mark.parametrize("held", [True, False], ids=["held", "free"])
def test_a_sweep_job_refuses_a_directory_another_process_holds(tmp_path, held):
    job_dir = tmp_path / "sweep" / "0"
    job_dir.mkdir(parents=True)
    composed = []

    def compose():
        composed.append(True)
        return tiny_config(**SHORT), [], None

    holder = hold_lock(job_dir) if held else None
    try:
        before = file_bytes(job_dir)
        value = run_job(compose, job_dir, ["seed=1"], 0, "best_top1")
        if held:
            assert math.isnan(value) and composed == [] and file_bytes(job_dir) == before  # no results.json either
        else:
            results = read_results(job_dir)
            assert composed == [True] and results["status"] == "completed" and value == results["best_top1"]
    finally:
        if holder is not None:
            holder.kill()
            holder.wait()


# ---------------------------------------------------------------- a full disk, and failures in general


def full_disk_at(monkeypatch, failing_save):
    """torch.save in checkpoint.py fails as on a full disk from the `failing_save`-th checkpoint on."""
    real_save, count = torch.save, {"n": 0}

    def save(state, f, *args, **kwargs):
        count["n"] += 1
        if count["n"] >= failing_save:
            f.write(b"PK\x03\x04 part of a checkpoint")
            raise OSError(errno.ENOSPC, "No space left on device")
        real_save(state, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", save)


@pytest.mark.parametrize("failing_save, kept, step", [(1, "there is no earlier checkpoint", 2),
                                                      (2, "the previous checkpoint there is intact", 2)],
                         ids=["first-checkpoint", "a-later-checkpoint"])
def test_a_full_disk_goes_to_train_log_and_results_json_says_failed(tmp_path, monkeypatch, failing_save, kept, step):
    full_disk_at(monkeypatch, failing_save)
    with pytest.raises(CheckpointError) as failed:
        train(tiny_config(trainer={"max_steps": 2, "ckpt_every": 1, "log_every": 1}), tmp_path)
    message = str(failed.value)
    assert message.startswith(f"could not write {tmp_path / 'checkpoints' / 'last.pt'}: no space left on ")
    assert message.endswith(kept)
    results = read_results(tmp_path)
    assert results["status"] == "failed" and results["error"] == message and results["steps"] == failing_save
    log_lines = (tmp_path / "train.log").read_text().splitlines()
    assert log_lines[-1].endswith(f"[ERROR] {message}")
    left = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())  # last.pt and its step_N link, no *.tmp
    assert left == ([] if failing_save == 1 else ["last.pt", "step_00000001.pt"])


def test_a_metrics_row_that_does_not_fit_is_one_line_in_train_log_and_results_json(tmp_path, monkeypatch):
    """A disk that fills during the run may refuse metrics.jsonl first: the same one line, naming it."""
    import builtins

    import vit_train.outputs.metrics as metrics_module

    def full_open(path, mode="r", *args, **kwargs):
        if str(path).endswith("metrics.jsonl") and mode == "a":
            raise OSError(errno.ENOSPC, "No space left on device")
        return builtins.open(path, mode, *args, **kwargs)

    monkeypatch.setattr(metrics_module, "open", full_open, raising=False)
    with pytest.raises(OutputError) as failed:
        train(tiny_config(**SHORT), tmp_path)
    message = str(failed.value)
    assert message.startswith(f"could not write {tmp_path / 'metrics.jsonl'}: no space left on ")
    assert message.endswith(" MB free); free some space, then continue with resume=auto") and "\n" not in message
    results = read_results(tmp_path)
    assert results["status"] == "failed" and results["error"] == message and results["steps"] == 1
    assert (tmp_path / "train.log").read_text().splitlines()[-1].endswith(f"[ERROR] {message}")
    assert file_handlers() == []


def test_a_damaged_earlier_checkpoint_is_not_called_intact(tmp_path, monkeypatch):
    path = tmp_path / "last.pt"
    torch.save({"w": torch.zeros(1000)}, path)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    full_disk_at(monkeypatch, 1)
    with pytest.raises(CheckpointError) as failed:
        checkpoint_module.save_checkpoint({"w": torch.ones(1000)}, path)
    assert "intact" not in str(failed.value)
    assert str(failed.value).endswith("the earlier checkpoint there is damaged too (the CRC-32 of its record "
                                      "last/data/0 does not match: bytes changed after it was written (bit rot, a "
                                      "bad copy)); resume=auto passes over it to an older sound one")


def file_handlers():
    return [h for h in logging.getLogger("vit_train").handlers if isinstance(h, logging.FileHandler)]


@pytest.mark.parametrize("where", ["checkpoint", "data", "figures", "a bug"])
def test_no_train_log_handler_is_left_behind_by_a_failing_run(tmp_path, monkeypatch, where):
    """Wherever the run fails once train.log is open (a checkpoint write, the data, the figures' set-up,
    an unexpected error), the handler is gone afterwards and the reason is in results.json."""
    sections = {"trainer": {"max_steps": 2, "log_every": 1}}
    if where == "checkpoint":
        full_disk_at(monkeypatch, 1)
        expected = CheckpointError
    elif where == "data":
        def bad_step(run, images, targets):
            raise DataError("an image of the data set cannot be read")
        monkeypatch.setattr(trainer_module, "train_step", bad_step)
        expected = DataError
    elif where == "figures":
        def no_figures(*args, **kwargs):
            raise DataError("the val images cannot be read")
        monkeypatch.setattr("vit_train.train.run.TrainingVisuals", no_figures)
        sections["trainer"]["viz_every"] = 1
        expected = DataError
    else:
        def broken(run):
            raise ZeroDivisionError("division by zero")
        monkeypatch.setattr(trainer_module, "describe", broken)
        expected = ZeroDivisionError
    before = file_handlers()
    with pytest.raises(expected):
        train(tiny_config(**sections), tmp_path)
    assert file_handlers() == before == []
    if where != "figures":  # set-up failed before the run was built: no results to record
        results = read_results(tmp_path)
        assert results["status"] == "failed" and results["error"].endswith("cannot be read" if where == "data" else
                                                                           ("division by zero" if where == "a bug"
                                                                            else "there is no earlier checkpoint"))
        assert results["error"].splitlines()[-1] in (tmp_path / "train.log").read_text()


# ---------------------------------------------------------------- TensorBoard after a resume


def killed_after(event_file, last_step):
    """Make `event_file` what an attempt killed after `last_step` wrote, with its later values
    changed (as a run that was not resumed exactly would have): only what happened after the
    checkpoint resumed from may be taken from it."""
    from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.summary.writer.record_writer import RecordWriter

    events = [Event.FromString(r) for r in RawEventFileLoader(str(event_file)).Load()]
    events = [e for e in events if e.step <= last_step]
    for event in events:
        for value in event.summary.value:
            if event.step > 12 and value.HasField("simple_value"):
                value.simple_value += 100.0
    with open(event_file, "wb") as f:
        for event in events:
            RecordWriter(f).write(event.SerializeToString())


def test_tensorboard_holds_each_step_once_when_an_earlier_attempts_file_sorts_after_the_new_one(tmp_path):
    """Two event files started in the same second sort by process id, so an earlier attempt's file can
    sort after the resumed one's (forced here by its name). The earlier attempt was killed after
    step 14; the run resumes from step 12: each step once, with the uninterrupted run's values."""
    sections = {"trainer": {"log_every": 1, "ckpt_every": 3, "keep_last": 4}}
    reference = tmp_path / "reference"
    train(tiny_config(**sections), reference)
    run = tmp_path / "run"
    shutil.copytree(reference, run)
    (run / ".lock").unlink()
    [old] = (run / "tb").glob("events.out.tfevents.*")
    killed_after(old, 14)
    old.rename(old.with_name("events.out.tfevents.9999999999.zz.99999.0"))  # sorts after any file started now
    train(tiny_config(**sections, resume=str(run / "checkpoints" / "step_00000012.pt")), run)
    assert len(list((run / "tb").glob("events.out.tfevents.*"))) == 2
    for tag in ("train/loss", "train/lr", "val/top1"):
        assert tb_scalars(run, tag) == tb_scalars(reference, tag), tag
    assert [s for s, _ in tb_scalars(run, "train/loss")] == list(range(1, 17))
    assert not list((run / "tb").glob("*.tmp"))


def test_a_leftover_rewrite_of_an_event_file_is_removed_at_the_next_start(tmp_path):
    (tmp_path / "tb").mkdir()
    (tmp_path / "tb" / "rewrite.tmp").write_bytes(b"half")
    rundir.acquire(tmp_path).release()
    assert not (tmp_path / "tb" / "rewrite.tmp").exists()
    assert os.listdir(tmp_path / "tb") == []


# ---------------------------------------------------------------- faults other trainers' users reported

FAULT_SECTIONS = {"trainer": {"log_every": 1, "ckpt_every": 3, "keep_last": 3}}


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory):
    """An uninterrupted run: 16 steps, checkpoints at 3, 6, 8, 9, 12, 15, 16; step files 12, 15, 16 kept."""
    run_dir = tmp_path_factory.mktemp("reference")
    train(tiny_config(**FAULT_SECTIONS), run_dir)
    (run_dir / ".lock").unlink()
    return run_dir


def test_a_zero_byte_last_checkpoint_is_passed_over(tmp_path, reference_run, caplog):
    """facebookresearch/metaseq#53: a failed write left 0-byte checkpoint_last files, which resume then
    tried to load. Here last.pt (and step_16.pt, the same file) is empty: it is named in one line and
    the run continues from step_15.pt to the reference's end."""
    run_dir = tmp_path / "run"
    shutil.copytree(reference_run, run_dir)
    folder = run_dir / "checkpoints"
    (folder / "last.pt").write_bytes(b"")
    (folder / "step_00000016.pt").unlink()
    os.link(folder / "last.pt", folder / "step_00000016.pt")  # as the run keeps them: one file, two names
    train(tiny_config(**FAULT_SECTIONS, resume="auto"), run_dir)
    assert "last.pt cannot be read" in caplog.text and "step_00000015.pt at epoch 2, step 15" in caplog.text
    assert_same_run(run_dir, reference_run)


def test_resuming_from_another_runs_checkpoint_leaves_that_run_as_it_was(tmp_path, reference_run):
    """Lightning-AI/pytorch-lightning#16426: resuming from a checkpoint of an earlier run deleted that
    file at the next rotation. Here a new run directory continues from the reference's step 12: the
    reference's files keep every byte, and the new run ends with the reference's weights."""
    before = file_bytes(reference_run)
    run_dir = tmp_path / "continued"
    train(tiny_config(**FAULT_SECTIONS, resume=str(reference_run / "checkpoints" / "step_00000012.pt")), run_dir)
    assert file_bytes(reference_run) == before
    got = model_weights(run_dir)
    want = model_weights(reference_run)
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == [
        "best.pt", "last.pt", "step_00000015.pt", "step_00000016.pt"]


def test_a_failed_write_removes_no_older_checkpoint(tmp_path, monkeypatch):
    """Lightning-AI/pytorch-lightning#1150 and #1696: deleting the oldest checkpoint before the new one
    is written loses everything when the write fails. Here the 4th write (step 9) meets a full disk:
    step_3, step_6 and step_8 stay, each loads, and last.pt is still step 8."""
    full_disk_at(monkeypatch, 4)
    with pytest.raises(CheckpointError):
        train(tiny_config(**FAULT_SECTIONS), tmp_path)
    folder = tmp_path / "checkpoints"
    assert sorted(p.name for p in folder.iterdir()) == ["best.pt", "last.pt", "step_00000003.pt", "step_00000006.pt",
                                                        "step_00000008.pt"]
    assert [checkpoint_module.load_checkpoint(folder / f"step_{s:08d}.pt")["step"] for s in (3, 6, 8)] == [3, 6, 8]
    assert checkpoint_module.load_checkpoint(folder / "last.pt")["step"] == 8


@pytest.mark.parametrize("free_kb, said", [(100, "not even the first will fit"),
                                            (400, "the run will stop at a later one"), (10**7, None)])
def test_a_disk_too_small_for_the_checkpoints_is_said_at_the_start(tmp_path, monkeypatch, caplog, free_kb, said):
    """mlfoundations/open_lm#154: a run on a disk too small for its checkpoint crashed after a whole
    epoch's work. The micro ViT's checkpoint is about 0.3 MB (model and AdamW's two moments), and with
    keep_last=2 four may be on disk at once: 100 kB free holds none, 400 kB one, 10 GB all; said
    before the first step."""
    import shutil as shutil_module
    from collections import namedtuple

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil_module, "disk_usage", lambda path: usage(2**40, 0, free_kb * 1024))
    seen = []

    def first_step(run, images, targets):  # what was said before it, and stop
        seen.append(caplog.text)
        raise DataError("stop here")

    monkeypatch.setattr(trainer_module, "train_step", first_step)
    with pytest.raises(DataError):
        train(tiny_config(trainer={"keep_last": 2}), tmp_path)
    warnings = [r.getMessage() for r in caplog.records if "free, but the checkpoints need about" in r.getMessage()]
    if said is None:
        assert warnings == []
    else:
        [warning] = warnings
        assert re.fullmatch(rf"\S+ has {free_kb / 1024:.1f} MB free, but the checkpoints need about 1\.\d MB "
                            rf"\(4 of 0\.\d MB: 2 kept, best\.pt and a new one written beside them\); {said}: free "
                            rf"some space, or lower trainer\.keep_last", warning), warning
        assert warning in seen[0]  # before the first step
