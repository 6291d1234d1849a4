"""Kill a process with a real SIGKILL at the n-th file-system call of its checkpoint saves, as
`strace -e inject=rename:signal=SIGKILL:when=N` does, in pure Python: an audit hook (PEP 578) sees
every open for writing, rename, link and unlink before the system call is made, and os.fsync is
wrapped; the calls on files under <run dir>/checkpoints and on results.json are counted, and the n-th
is never made. Used by tests/outputs/test_save_order.py:

    python tests/helpers/fs_killer.py '{"run_dir": ..., "sections": {...}, "seed": 1, "n": 7}'   # killed at call 7
    python tests/helpers/fs_killer.py '{"run_dir": ..., "sections": {...}, "seed": 1, "n": 0}'   # lists the calls
    ... "n": ["os.rename", "best.pt.tmp -> best.pt", 2]       # killed at the second rename of best.pt

With n = 0 the run ends normally and prints the calls, one JSON list [kind, file name] a line.
`python tests/helpers/fs_killer.py saves DIR` makes the scripted saves `SAVES` (small checkpoints, no
training) in DIR/checkpoints, unarmed: for `strace -e inject=...` to kill.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

# (step, best_step) of each save of tests/outputs/test_save_order.py's run; None: not evaluated yet
SAVES = [(3, None), (4, 4), (6, 4), (8, 4), (9, 4), (12, 12), (15, 12), (16, 12)]
WATCHED = {"open", "os.rename", "os.link", "os.remove", "shutil.copyfile", "os.truncate"}


def fake_state(step: int, best_step: int | None) -> dict:
    """A small checkpoint whose tensors say which step it is."""
    import torch

    return {"model": {"w": torch.full((8,), float(step))}, "optimizer": {}, "scheduler": {}, "epoch": 0,
            "step": step, "batch_in_epoch": 0, "config": {}, "class_names": ["a"],
            "best_step": best_step or 0, "best_score": None if best_step is None else float(best_step)}


def save_all(folder: Path, saves=SAVES) -> None:
    """`saves` as the run makes them: keep_last 2, best.pt at each new best."""
    from vit_train.checkpoint import save_run_checkpoint

    for step, best_step in saves:
        save_run_checkpoint(fake_state(step, best_step), folder, keep_last=2, best=best_step == step)


def arm(run_dir: Path, n: int | list, calls: list | None = None, everything: bool = False) -> None:
    """Count the file-system calls on run_dir/checkpoints/* and run_dir/results.json(.tmp) in this process
    (everything=True: on every file under run_dir, named by their path there: metrics.jsonl, tb/..., the
    lock, train.log too); SIGKILL it at the n-th (before the call is made), or with n = [kind, name, k] at
    the k-th call [kind, name] (e.g. ["os.rename", "best.pt.tmp -> best.pt", 2]); append each call to
    `calls` when given (everything=True: an open that creates its file as [kind, name, "new"], a folder's
    fsync as its name and "/", the run directory's as "./")."""
    run_dir = Path(os.path.realpath(run_dir))  # as /proc/self/fd names it
    checkpoints, results = str(run_dir / "checkpoints") + os.sep, str(run_dir / "results.json")
    count, matching = [0], [0]

    def watched(path) -> str | None:
        path = os.fsdecode(path) if isinstance(path, (str, bytes, os.PathLike)) else None
        if path and everything and path.startswith(str(run_dir) + os.sep):
            return os.path.relpath(path, run_dir)
        if path and (path.startswith(checkpoints) or path.startswith(results)):
            return os.path.basename(path)
        return None

    def hit(kind: str, name: str, new: bool = False) -> None:
        count[0] += 1
        if calls is not None:
            calls.append([kind, name, "new"] if new else [kind, name])
        if isinstance(n, list) and [kind, name] == n[:2]:
            matching[0] += 1
        if count[0] == n or isinstance(n, list) and matching[0] == n[2] and [kind, name] == n[:2]:
            sys.stdout.flush()
            os.kill(os.getpid(), signal.SIGKILL)

    def hook(event: str, args: tuple) -> None:
        if event not in WATCHED:
            return
        if event == "open" and not (isinstance(args[1], str) and set(args[1]) & set("wax+")
                                    or isinstance(args[2], int) and args[2] & (os.O_WRONLY | os.O_RDWR)):
            return  # reads (verifying, peeking at a step) change nothing
        names = [watched(a) for a in args[:2] if event in ("os.rename", "os.link", "shutil.copyfile")] or [watched(args[0])]
        if any(names):  # everything=True: an open that creates its file is listed as [open, name, "new"]
            new = everything and event == "open" and isinstance(args[0], (str, bytes, os.PathLike)) \
                and not os.path.exists(args[0])
            hit(event, " -> ".join(name or "?" for name in names), new)

    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        target = os.readlink(f"/proc/self/fd/{fd}")
        if target == checkpoints.rstrip(os.sep):
            hit("os.fsync", "checkpoints/")
        elif everything and target == str(run_dir):
            hit("os.fsync", "./")
        elif everything and watched(target) and os.path.isdir(target):
            hit("os.fsync", watched(target) + "/")
        elif watched(target):
            hit("os.fsync", watched(target))
        real_fsync(fd)

    os.fsync = fsync
    sys.addaudithook(hook)


if __name__ == "__main__" and sys.argv[1] == "saves":
    save_all(Path(sys.argv[2]) / "checkpoints")
elif __name__ == "__main__":
    sys.path[0] = str(Path(__file__).resolve().parents[1])  # tests/ first: `helpers` as a package
    from helpers.configs import tiny_config  # noqa: E402

    import vit_train.train.trainer as trainer  # noqa: E402

    spec = json.loads(sys.argv[1])
    run_dir, seen = Path(spec["run_dir"]), []
    arm(run_dir, spec["n"], seen)
    trainer.train(tiny_config(**spec["sections"], seed=spec.get("seed", 0), resume=spec.get("resume")), run_dir)
    for call in seen:
        print(json.dumps(call))
