"""data=hf's Arrow copy of parquet files (vit_train/data/sources/hf_files.py): a killed run's copy is removed by the
next data=hf run, in one line naming it and its size; a copy whose owner still runs is never removed,
whatever its pid says; a folder with no owner record (an older vit-train's copy) only when it is clearly
one, old, and no process here has a file of it open or mapped."""

import ctypes
import json
import mmap
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

pytest.importorskip("datasets")

from helpers.hf_sets import hf_parquet  # noqa: E402
from helpers.runs import vit_train  # noqa: E402
from vit_train.data.sources import hf_files as hf_files  # noqa: E402
from vit_train.data.sources.hf_files import reclaim_copies  # noqa: E402
from vit_train.data.sources.hf import load_hf_splits  # noqa: E402

TESTS = Path(__file__).parents[1]
LINE = re.compile(r"data=hf: removed (\d+) Arrow cop(?:y|ies) left by (?:a killed data=hf run|killed data=hf runs), "
                  r"[\d.]+ (?:bytes|KB|MB|GB) freed: (.*)")


@pytest.fixture
def temp_dir(tmp_path, monkeypatch):
    """The test's own temp dir ($TMPDIR for its subprocesses, tempfile's for this process): the copies that
    other runs on this machine keep in /tmp are neither seen nor touched."""
    path = tmp_path / "tmp"
    path.mkdir()
    monkeypatch.setenv("TMPDIR", str(path))
    monkeypatch.setattr(tempfile, "tempdir", str(path))
    return path


def copies(temp_dir: Path) -> list[Path]:
    return sorted(temp_dir.glob(hf_files.COPY_PREFIX + "*"))


def freed_line(text: str) -> str:
    lines = [line for line in text.splitlines() if LINE.search(line)]
    assert len(lines) == 1, text[-3000:]
    return LINE.search(lines[0]).group(0)


def hold_copies(n: int = 1) -> list[tuple[int, Path]]:
    """`n` forked children that each made a copy folder (as a data=hf run on parquet files does) and live until
    killed (`kill`): [(pid, folder)], 5000 bytes of Arrow file put in each folder."""
    held = []
    for _ in range(n):
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: never back into pytest
            try:
                os.close(read)
                os.write(write, f"{hf_files.make_copy_folder()}\n".encode())
                time.sleep(300)
            finally:
                os._exit(0)
        os.close(write)
        with os.fdopen(read) as f:
            copy = Path(f.readline().strip())
        assert copy.is_dir(), copy
        (copy / "parquet").mkdir()
        (copy / "parquet" / "parquet-train.arrow").write_bytes(bytes(5000))
        held.append((pid, copy))
    return held


def kill(pid: int) -> None:
    """SIGKILL: no exit code of the child runs, as with kill -9 or the OOM killer."""
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)


def old_copy(temp_dir: Path, name: str, age_s: float = hf_files.UNOWNED_GRACE_S + 60, extra: str | None = None) -> Path:
    """A copy as vit-train left it before copies had an owner.lock: datasets' parquet cache (its lock file, an
    Arrow file), every entry `age_s` old; `extra` adds a file of that name (not datasets')."""
    copy = temp_dir / f"{hf_files.COPY_PREFIX}{name}"
    arrow = copy / "parquet" / "default-5947e9e1ab2259c1" / "0.0.0" / "a859584b"
    arrow.mkdir(parents=True)
    (arrow / "parquet-train.arrow").write_bytes(bytes(3000))
    (arrow.parent / "a859584b_builder.lock").write_bytes(b"")
    (copy / f"_tmp_{copy.name}_parquet_default-5947e9e1ab2259c1_0.0.0_a859584b.lock").write_bytes(b"")
    if extra:
        (copy / extra).write_text("mine")
    then = time.time() - age_s
    for path in [*copy.rglob("*"), copy]:
        os.utime(path, (then, then), follow_symlinks=False)
    return copy


@pytest.mark.slow  # two runs of the command line: 12 to 20 s on 2 busy cores; the next test is its fast twin
def test_a_killed_runs_copy_is_removed_by_its_resume_in_one_line(tmp_path, temp_dir):
    """A real data=hf run on parquet files, SIGKILLed mid-epoch (no atexit runs), leaves its copy in $TMPDIR;
    the resume removes it, says so, and finishes, removing its own copy at exit."""
    root, run = hf_parquet(tmp_path / "ds"), tmp_path / "run"
    args = ["data=hf", f"data.root={root}", "model=vit_micro", "model.embed_dim=32", "model.depth=2",
            "model.num_heads=2", "model.img_size=16", "model.patch_size=4", "data.batch_size=8", "data.num_workers=0",
            "trainer.device=cpu", "trainer.progress=false", "trainer.log_every=1", "trainer.ckpt_every=2",
            "trainer.epochs=2", f"hydra.run.dir={run}"]
    code = (f"import sys; sys.path.insert(0, {str(TESTS)!r}); from helpers.killer import arm; arm('row', 3); "
            "from vit_train.cli.train import train_main; sys.argv[0] = 'vit-train'; train_main()")
    killed = subprocess.run([sys.executable, "-c", code, *args], cwd=tmp_path, capture_output=True, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"}, timeout=300)
    assert killed.returncode == -9, killed.stderr[-3000:]
    [left] = copies(temp_dir)
    assert (left / hf_files.OWNER_LOCK).is_file() and list(left.rglob("*.arrow"))
    assert json.loads((left / hf_files.OWNER_LOCK).read_text())["host"] == socket.gethostname()

    resumed = vit_train(f"resume={run}", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    line = freed_line(resumed.stdout + resumed.stderr)
    assert re.fullmatch(rf"data=hf: removed 1 Arrow copy left by a killed data=hf run, (\d+ KB) freed: "
                        rf"{re.escape(str(left))} \(\1\)", line), line
    assert line in (run / "train.log").read_text()
    assert not left.exists() and copies(temp_dir) == []  # the resume's own copy went at its exit
    results = json.loads((run / "results.json").read_text())
    assert results["status"] == "completed" and results["steps"] == 6


def test_a_killed_data_hf_process_leaves_its_copy_and_the_next_data_hf_load_removes_it(tmp_path, temp_dir, caplog):
    """The same in this process (fast): a forked child reads the parquet set as a run does and is SIGKILLed;
    its copy stays; the next load_hf_splits (what every data=hf run calls first) removes it in one line."""
    caplog.set_level("INFO", "vit_train")
    root = hf_parquet(tmp_path / "ds")
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never back into pytest
        try:
            os.close(read)
            train, _, _ = load_hf_splits(root, "image", "label", "train", None)
            os.write(write, f"{len(train)}\n".encode())
            time.sleep(300)
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        assert f.readline() == "24\n"
    kill(pid)
    [left] = copies(temp_dir)
    size = sum(p.stat().st_size for p in left.rglob("*") if p.is_file())
    assert list(left.rglob("*.arrow")) and size > 2**10
    train, _, _ = load_hf_splits(root, "image", "label", "train", None)
    assert len(train) == 24 and not left.exists() and len(copies(temp_dir)) == 1  # this process's own
    [line] = [r.getMessage() for r in caplog.records if LINE.search(r.getMessage())]
    assert line == (f"data=hf: removed 1 Arrow copy left by a killed data=hf run, {hf_files.size_text(size)} freed: "
                    f"{left} ({hf_files.size_text(size)})")


def test_a_copy_whose_owner_runs_is_kept_beside_a_second_run_and_freed_once_the_owner_is_killed(tmp_path, temp_dir,
                                                                                               caplog):
    caplog.set_level("INFO", "vit_train")
    [(holder, copy)] = hold_copies()
    try:
        assert reclaim_copies() == [] and copy.is_dir()
        train, val, _ = load_hf_splits(hf_parquet(tmp_path / "ds"), "image", "label", "train", None)  # a second run
        assert (len(train), len(val)) == (24, 8) and train[5][1] == 2
        [own] = [c for c in copies(temp_dir) if c != copy]
        assert reclaim_copies() == [] and copy.is_dir() and own.is_dir()  # nor this process's own
        assert not any(LINE.search(r.getMessage()) for r in caplog.records)
    finally:
        kill(holder)
    size = sum(p.stat().st_size for p in copy.rglob("*") if p.is_file())
    assert reclaim_copies() == [(copy, size)] and not copy.exists() and own.is_dir()
    assert train[23][1] == 2  # this process's copy still reads
    [line] = [r.getMessage() for r in caplog.records if LINE.search(r.getMessage())]
    assert line == f"data=hf: removed 1 Arrow copy left by a killed data=hf run, 5 KB freed: {copy} (5 KB)"


def test_a_dead_owner_is_told_by_its_free_lock_not_by_its_recorded_pid(temp_dir):
    """pid reuse: the record names a live process (this one, on this host), but no one holds the lock."""
    copy = temp_dir / f"{hf_files.COPY_PREFIX}reused"
    copy.mkdir()
    (copy / hf_files.OWNER_LOCK).write_text(json.dumps({"host": socket.gethostname(), "pid": os.getpid(),
                                                        "since": "2026-12-01 10:00:00", "command": "vit-train"}))
    assert [folder for folder, _ in reclaim_copies()] == [copy] and not copy.exists()


def test_two_dead_runs_copies_are_named_in_one_line(temp_dir, caplog):
    caplog.set_level("INFO", "vit_train")
    holders = hold_copies(2)
    for holder, _ in holders:
        kill(holder)
    gone = sorted(copy for _, copy in holders)
    assert [folder for folder, _ in reclaim_copies()] == gone
    [line] = [r.getMessage() for r in caplog.records if LINE.search(r.getMessage())]
    assert line == (f"data=hf: removed 2 Arrow copies left by killed data=hf runs, 10 KB freed: {gone[0]} (5 KB), "
                    f"{gone[1]} (5 KB)")


def map_without_descriptor(path: Path):
    """Map `path` into this process and close its descriptor, as a reader of Arrow files may leave it (Python's
    mmap keeps a descriptor of its own, so libc's mmap): only /proc/PID/maps shows it. Returns the unmapping."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype, libc.munmap.argtypes = ctypes.c_void_p, (ctypes.c_void_p, ctypes.c_size_t)
    libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long)
    fd, size = os.open(path, os.O_RDONLY), path.stat().st_size
    address = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
    os.close(fd)
    assert address not in (None, ctypes.c_void_p(-1).value), os.strerror(ctypes.get_errno())
    return lambda: libc.munmap(address, size)


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="without /proc a folder with no owner record is kept")
def test_a_folder_without_an_owner_record_is_removed_only_when_clearly_an_old_idle_copy(tmp_path, temp_dir):
    """Decision: an older vit-train's copy (no owner.lock) is removed when it holds only what datasets' parquet
    loader writes, nothing in it changed for UNOWNED_GRACE_S, and no process here has a file of it open or
    mapped; anything else named like a copy (other files in it, a link, a file, fresh) is kept."""
    idle = old_copy(temp_dir, "idle")
    fresh = old_copy(temp_dir, "fresh", age_s=60)
    foreign = old_copy(temp_dir, "foreign", extra="notes.txt")
    opened, mapped = old_copy(temp_dir, "opened"), old_copy(temp_dir, "mapped")
    (tmp_path / "elsewhere").mkdir()
    (temp_dir / f"{hf_files.COPY_PREFIX}link").symlink_to(old_copy(tmp_path / "elsewhere", "target"))
    (temp_dir / f"{hf_files.COPY_PREFIX}file").write_text("not a folder")
    reader = open(next(opened.rglob("*.arrow")), "rb")
    unmap = map_without_descriptor(next(mapped.rglob("*.arrow")))
    try:
        assert [folder for folder, _ in reclaim_copies()] == [idle]
        assert not idle.exists() and all(p.is_dir() for p in (fresh, foreign, opened, mapped))
        assert len(copies(temp_dir)) == 6
    finally:
        reader.close()
        unmap()
    assert [folder for folder, _ in reclaim_copies()] == [mapped, opened]  # no longer in use
    assert {p.name for p in copies(temp_dir)} == {f"{hf_files.COPY_PREFIX}{n}" for n in ("fresh", "foreign", "link",
                                                                                         "file")}



def test_the_jobs_of_a_sweep_in_one_process_share_one_copy(tmp_path, temp_dir):
    """A sweep runs its jobs one after another in one process: each job's load of the same parquet files uses
    the process's one copy folder, not a new full copy per job (four jobs held four copies until the sweep ended)."""
    root = hf_parquet(tmp_path / "ds")
    for _ in range(3):
        load_hf_splits(root, "image", "label", "train", None)
    assert len(copies(temp_dir)) == 1
