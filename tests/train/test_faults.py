"""Faults injected as an adversary would, each judged against an uninterrupted run with the same
seed: every file a user reads (tests/helpers/files.py `assert_every_file_as_the_reference`: last.pt,
best.pt, step files, results.json, metrics.jsonl, every TensorBoard tag, train.log's closing line) where
the run's files are complete, else `assert_same_run`; for a sweep, every job's files and the summary:
kill -9 at chosen moments, a killed sweep job, bit rot, full disks, two writers, torn logs."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers.cases import FAST_KILL_MOMENTS, FLIPPED_PLACES, KILL_MOMENTS
from helpers.configs import TINY, tiny_config
from helpers.files import (assert_every_file_as_the_reference, assert_same_run, assert_same_sweep, file_bytes,
                           model_weights, rows)
from helpers.kill_resume import kill_9_at, resume_as_the_reference
from helpers.runs import hold_lock, lock_is_free, start_vit_train, vit_train
from vit_train.outputs import integrity
from vit_train.checkpoint import load_checkpoint
from vit_train.outputs.metrics import RunLogger
from vit_train.train.trainer import train

HELPERS = Path(__file__).parents[1] / "helpers"
# 16 steps (2 epochs of 8), every step logged, checkpoints at 3, 6, 8 (eval), 9, 12, 15, 16 (eval).
SECTIONS = {"trainer": {"log_every": 1, "ckpt_every": 3, "keep_last": 2}}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("reference")
    train(tiny_config(**SECTIONS), run_dir)
    return run_dir


@pytest.mark.parametrize("case", [c if c in FAST_KILL_MOMENTS else pytest.param(c, marks=pytest.mark.slow)
                                  for c in KILL_MOMENTS])
def test_kill_9_then_resume_auto_equals_the_uninterrupted_run(tmp_path, make_config, reference, case):
    fault, n = KILL_MOMENTS[case]
    kill_9_at(tmp_path, SECTIONS, fault, n)
    resume_as_the_reference(tmp_path, SECTIONS, reference)


def test_resume_auto_on_a_finished_run_adds_no_row(tmp_path, make_config, reference):
    train(make_config(**SECTIONS), tmp_path)
    before = rows(tmp_path)
    train(make_config(**SECTIONS, resume="auto"), tmp_path)
    assert rows(tmp_path) == before
    assert_every_file_as_the_reference(tmp_path, reference)


def test_a_fresh_start_cuts_an_earlier_log_back_to_step_0_and_skips_a_torn_line(tmp_path):
    log = tmp_path / "metrics.jsonl"
    log.write_text('{"split": "train", "step": 1, "loss": 2.0}\n{"split": "train", "step": 2, "lo')  # killed mid-row
    RunLogger(tmp_path).close()
    assert log.read_text() == ""
    log.write_text('{"split": "train", "step": 1, "loss": 2.0}\n{"split": "val", "step": 2, "top1": 5.0}\n{"spl')
    logger = RunLogger(tmp_path, resume_step=1)
    logger.scalars("train", 1, {"loss": 9.0})  # already logged: not again
    logger.scalars("train", 2, {"loss": 3.0})
    logger.close()
    assert [(r["split"], r["step"], r["loss"]) for r in rows(tmp_path)] == [("train", 1, 2.0), ("train", 2, 3.0)]


def test_the_oracle_finds_a_change_to_any_file_a_user_reads(tmp_path, reference):
    """assert_every_file_as_the_reference passes a copy of the reference and fails on each file changed
    alone: best.pt holding another step, a step file gone, results.json's best step, a TensorBoard tag
    beyond loss and top-1, train.log's closing line, one row's value."""
    import json as json_module

    def damaged(name, change):
        run_dir = tmp_path / name
        shutil.copytree(reference, run_dir, ignore=shutil.ignore_patterns(".lock"))
        change(run_dir)
        return run_dir

    assert_every_file_as_the_reference(damaged("copy", lambda r: None), reference)

    def best_pt_stale(r):
        shutil.copyfile(r / "checkpoints" / "step_00000015.pt", r / "checkpoints" / "best.pt")

    def results_best_step(r):
        results = json_module.loads((r / "results.json").read_text())
        (r / "results.json").write_text(json_module.dumps({**results, "best_step": 8}))

    def tb_lr_tag(r):
        from torch.utils.tensorboard import SummaryWriter

        with SummaryWriter(str(r / "tb")) as writer:
            writer.add_scalar("train/lr", 1.0, 17)

    def closing_line(r):
        with open(r / "train.log", "a") as log:
            log.write("[2026-12-02 00:00:00,000][INFO] stopped by SIGTERM at step 16\n")

    def one_row(r):
        lines = (r / "metrics.jsonl").read_text().splitlines()
        row = json_module.loads(lines[3])
        lines[3] = json_module.dumps({**row, "grad_norm": row["grad_norm"] + 1e-6})
        (r / "metrics.jsonl").write_text("\n".join(lines) + "\n")

    changes = {"best.pt": best_pt_stale, "step file": lambda r: (r / "checkpoints" / "step_00000015.pt").unlink(),
               "results.json": results_best_step, "tb": tb_lr_tag, "train.log": closing_line, "row": one_row}
    for name, change in changes.items():
        with pytest.raises(AssertionError):
            assert_every_file_as_the_reference(damaged(name.replace(" ", "_"), change), reference)


# ---------------------------------------------------------------- a sweep job killed, the sweep re-run

SWEEP_BASE = {"trainer": {"log_every": 1, "ckpt_every": 3, "keep_last": 2, "eval_every": 4}, "seed": 1}
GRID = [["optim.lr=0.001"], ["optim.lr=0.0005"]]


@pytest.fixture(scope="module")
def reference_sweep(tmp_path_factory):
    from helpers.sweep_runs import sweep

    sweep_dir = tmp_path_factory.mktemp("reference_sweep")
    sweep(sweep_dir, GRID, SWEEP_BASE)
    return sweep_dir


@pytest.mark.parametrize("fault, n, order", [("renamed", 5, 1), ("results", 1, -1)],
                         ids=["killed-after-a-rename-same-order", "killed-before-results-json-reversed-grid"])
def test_a_killed_sweep_job_then_the_sweep_re_run_leaves_the_uninterrupted_sweeps_files(tmp_path, reference_sweep,
                                                                                         fault, n, order):
    """Job 1 killed (SIGKILL, a forked child) after its 5th checkpoint's rename, or before its results.json;
    the sweep re-run (the grid reversed: each job is found where it ran): every job's files, no
    refused.json, summary.csv and summary.md (but timings) as the uninterrupted sweep's."""
    import signal

    from helpers.killer import arm
    from helpers.sweep_runs import run_sweep_job, sweep

    run_sweep_job(tmp_path, 0, GRID[0], SWEEP_BASE)
    pid = os.fork()
    if pid == 0:
        arm(fault, n)
        run_sweep_job(tmp_path, 1, GRID[1], SWEEP_BASE)
        os._exit(1)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, status
    assert not (tmp_path / "1" / "results.json").exists()
    sweep(tmp_path, GRID[::order], SWEEP_BASE)
    assert_same_sweep(tmp_path, reference_sweep)


def test_resume_auto_without_a_checkpoint_beside_a_folder_removed_while_it_is_listed(tmp_path, monkeypatch):
    """Found by the fault table: a run killed before its first checkpoint, resumed with resume=auto, looks for
    earlier runs two folders up (Hydra's <date>/<time>); there (/tmp, a shared scratch space) another
    process's folder that vanishes while it is listed (multiprocessing's /tmp/pymp-*) ended the resume in
    FileNotFoundError. Forced: listing `gone` raises as a folder removed meanwhile. The run starts at step
    0 and its line names the earlier run beside it."""
    import vit_train.train.trainer as trainer_module

    earlier, gone, run_dir = tmp_path / "day" / "earlier", tmp_path / "gone", tmp_path / "today" / "run"
    (earlier / "checkpoints").mkdir(parents=True)
    (earlier / "checkpoints" / "last.pt").write_bytes(b"")
    (gone / "x").mkdir(parents=True)
    run_dir.mkdir(parents=True)
    real_scandir = os.scandir

    def scandir(path="."):
        if os.fspath(path) == str(gone):
            raise FileNotFoundError(2, "No such file or directory", str(gone))
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", scandir)
    assert trainer_module.resume_auto_found_nothing(run_dir) == (
        f"resume=auto: no checkpoint in {run_dir} (hydra.run.dir), so this run starts at step 0; to continue an "
        f"earlier run, give its directory, e.g. the newest beside it: vit-train resume={earlier}")
    results = train(tiny_config(trainer={"max_steps": 1}, resume="auto"), run_dir)
    assert results["status"] == "completed"


# ---------------------------------------------------------------- bit rot


def flip(path, offset, count=16):
    data = bytearray(path.read_bytes())
    for i in range(offset, min(offset + count, len(data))):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


def test_bit_rot_in_last_pt_is_reported_and_the_run_falls_back_to_the_newest_sound_checkpoint(
        tmp_path, make_config, reference, caplog):
    sections = {"trainer": {**SECTIONS["trainer"], "keep_last": 3}}
    train(make_config(**sections), tmp_path)  # step files 12, 15, 16; last.pt is step 16
    last = tmp_path / "checkpoints" / "last.pt"
    flip(last, last.stat().st_size // 2)  # step_16 too: the same file
    train(make_config(**sections, resume="auto"), tmp_path)
    assert "last.pt is damaged (the CRC-32 of its record" in caplog.text
    assert "resumed from" in caplog.text and "step_00000015.pt at epoch 2, step 15" in caplog.text
    assert_same_run(tmp_path, reference)


def test_every_flipped_region_of_a_checkpoint_is_refused_or_harmless(tmp_path, make_config):
    """16 bytes flipped at FLIPPED_PLACES (48) places from the first byte to the last: the load is refused with one
    line, or (padding, fields the reader ignores) gives exactly the saved tensors. Never a silent change."""
    train(make_config(trainer={"max_steps": 1}), tmp_path)
    sound = tmp_path / "checkpoints" / "last.pt"
    original = torch.load(sound, weights_only=True)
    size = sound.stat().st_size
    refused = 0
    for k in range(FLIPPED_PLACES):
        damaged = tmp_path / f"damaged_{k}.pt"
        damaged.write_bytes(sound.read_bytes())
        flip(damaged, k * (size - 16) // (FLIPPED_PLACES - 1))
        try:
            got = load_checkpoint(damaged)
        except Exception as e:  # noqa: BLE001 - anything but a CheckpointError is a failure too
            assert type(e).__name__ == "CheckpointError" and "\n" not in str(e), repr(e)
            refused += 1
            continue
        for key in ("model", "optimizer", "rng"):
            flat_a, flat_b = (torch.utils._pytree.tree_flatten(x[key])[0] for x in (got, original))
            assert all(torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b for a, b in zip(flat_a, flat_b))
    assert refused >= 40  # most bytes matter; the few that do not are proven harmless above


# ---------------------------------------------------------------- two writers


@pytest.mark.slow  # in the slow suite to keep `pytest` near 5 minutes on 2 cores
def test_a_forked_child_does_not_keep_the_lock(tmp_path):
    from vit_train.outputs import rundir

    lock = rundir.acquire(tmp_path)
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # a DataLoader worker, say, that outlives the lock for a moment
        os.read(read, 1)
        os._exit(0)
    try:
        lock.release()
        assert lock_is_free(tmp_path)
    finally:
        os.write(write, b"x")
        os.waitpid(child, 0)


def test_a_leftover_temp_file_is_removed_once_the_lock_is_held(tmp_path):
    from vit_train.outputs import rundir

    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "last.pt.tmp").write_bytes(b"PK half")
    (tmp_path / "metrics.jsonl.tmp").write_text("{")
    (tmp_path / "checkpoints" / "last.pt").write_bytes(b"kept")
    rundir.acquire(tmp_path).release()
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == [".lock", "last.pt"]


# ---------------------------------------------------------------- full disks


def private_mount_namespace() -> list[str] | None:
    """`unshare` arguments that give a private mount namespace where this user may mount a tmpfs."""
    if not shutil.which("unshare"):
        return None
    for args in (["unshare", "-m"], ["unshare", "-rm"]):  # root; an unprivileged user namespace
        if subprocess.run([*args, "true"], capture_output=True).returncode == 0:
            return args
    return None


def fill_tmpfs(out, size_kb):
    """tests/helpers/diskfull.py on a `size_kb` tmpfs: the run fails, space is freed, it resumes; its report."""
    unshare = private_mount_namespace()
    if unshare is None:
        pytest.skip("cannot mount a tmpfs here (no unshare, no user namespaces); the simulated tests cover the messages")
    done = subprocess.run([*unshare, sys.executable, str(HELPERS / "diskfull.py"), str(out),
                           str(size_kb), json.dumps(SECTIONS)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]  # not even from TensorBoard's writer thread
    return json.loads((out / "report.json").read_text())


@pytest.mark.parametrize("size_kb, kept", [
    pytest.param(200, "there is no earlier checkpoint", marks=pytest.mark.slow),
    (450, "the previous checkpoint there is intact")], ids=["first-checkpoint", "a-later-checkpoint"])
def test_a_full_tmpfs_says_so_and_resume_after_freeing_space_equals_the_uninterrupted_run(
        tmp_path, reference, size_kb, kept):
    """A real tmpfs (290 kB checkpoints): 200 kB holds none, 450 kB holds one but not a second beside it."""
    report = fill_tmpfs(tmp_path, size_kb)
    message = report["first"]
    assert message.startswith("could not write ") and "\n" not in message, message
    assert f"no space left on {report['mount']} (" in message and " MB free, the checkpoint needs about 0.3 MB)" in message
    assert message.endswith(kept)
    assert "unexpected pos" not in message
    assert not [name for name in report["checkpoints_after_failure"] if name.endswith(".tmp")]
    assert report["results_after_failure"]["status"] == "failed"
    assert report["results_after_failure"]["error"] == message
    assert report["log_after_failure"].rstrip().splitlines()[-1].endswith(f"[ERROR] {message}")
    assert_every_file_as_the_reference(tmp_path / "run", reference)


@pytest.mark.parametrize("size_kb", [4, pytest.param(12, marks=pytest.mark.slow)])
def test_a_tmpfs_too_full_for_the_logs_names_the_file_in_one_line_and_resume_equals_the_uninterrupted_run(
        tmp_path, reference, size_kb):
    """4 kB: TensorBoard's first event does not fit; 12 kB: a metrics.jsonl row does not (train.log is
    full before either: one warning). No traceback from TensorBoard's writer thread either."""
    report = fill_tmpfs(tmp_path, size_kb)
    mount = report["mount"]
    assert re.fullmatch(rf"could not write {re.escape(mount)}/run/(tb|metrics\.jsonl): no space left on "
                        rf"{re.escape(mount)} \(0\.0 MB free\); free some space, then continue with resume=auto",
                        report["first"]), report["first"]
    assert_every_file_as_the_reference(tmp_path / "run", reference)


def test_a_disk_full_write_in_torchs_own_words_is_named_as_such(tmp_path, monkeypatch):
    """torch's stream writer reports a full disk as "unexpected pos N vs M" (a RuntimeError): the
    message names the disk and the sizes instead. Simulated: the write fails that way while
    shutil.disk_usage reports 0.1 MB free."""
    import shutil as shutil_module
    from collections import namedtuple

    from vit_train.checkpoint import save_checkpoint
    from vit_train.errors import CheckpointError

    def full(state, f):
        f.write(b"PK\x03\x04" + b"\0" * 100)
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 1321216 vs 1321104")

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(torch, "save", full)
    monkeypatch.setattr(shutil_module, "disk_usage", lambda path: usage(2**30, 2**30 - 2**17, 2**17))
    with pytest.raises(CheckpointError) as failed:
        save_checkpoint({"model": {"w": torch.zeros(2**18)}}, tmp_path / "last.pt")
    assert str(failed.value) == (f"could not write {tmp_path / 'last.pt'}: no space left on "
                                 f"{integrity.mount_point(tmp_path)} (0.1 MB free, the checkpoint needs about 1.0 MB); "
                                 f"there is no earlier checkpoint")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_a_second_vit_train_into_a_running_runs_directory_exits_2_and_changes_nothing(tmp_path):
    """The first run is paused (SIGSTOP) mid-training while a second, with another seed, is started
    into its hydra.run.dir: the second exits 2 naming the first's pid, not one byte of the directory
    changes, and the first, continued, ends exactly as an undisturbed run."""
    import signal

    args = [*TINY, "trainer.max_steps=12", "trainer.log_every=1", "data.num_workers=0"]
    reference_run = tmp_path / "reference"
    assert vit_train(*args, f"hydra.run.dir={reference_run}", cwd=tmp_path).returncode == 0
    run = tmp_path / "run"
    first = start_vit_train(*args, f"hydra.run.dir={run}", cwd=tmp_path, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    try:
        while not ((run / "metrics.jsonl").exists() and rows(run)):
            assert first.poll() is None, first.stderr.read()
        os.kill(first.pid, signal.SIGSTOP)
        before = file_bytes(run)
        second = vit_train(*args, "seed=1", f"hydra.run.dir={run}", cwd=tmp_path)
        assert second.returncode == 2 and second.stderr.count("\n") == 1, second.stderr
        assert f"is in use by another vit-train run (pid {first.pid} on " in second.stderr
        assert file_bytes(run) == before
    finally:
        os.kill(first.pid, signal.SIGCONT)
    assert first.wait(timeout=300) == 0, first.stderr.read()
    assert [(r["split"], r["step"], r.get("loss")) for r in rows(run)] == \
        [(r["split"], r["step"], r.get("loss")) for r in rows(reference_run)]
    a, b = (model_weights(r) for r in (run, reference_run))
    assert all(torch.equal(a[k], b[k]) for k in b)


@pytest.mark.slow  # in the slow suite to keep `pytest` near 5 minutes on 2 cores
def test_a_second_sweep_into_a_sweep_directory_in_use_is_refused(tmp_path):
    holder = hold_lock(tmp_path / "sweep")
    try:
        done = vit_train("-m", *TINY, "trainer.max_steps=1", "seed=1,2", f"hydra.sweep.dir={tmp_path / 'sweep'}",
                         cwd=tmp_path)
        assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
        assert f"sweep is in use by another vit-train run (pid {holder.pid} on " in done.stderr
        assert [p.name for p in (tmp_path / "sweep").iterdir()] == [".lock"]
    finally:
        holder.kill()
        holder.wait()
