"""What a part writes (`Recorder`) and how it runs the project's commands (`run_command`).

Parts call vit-train and vit-eval through their entry points in a subprocess, as a user would:
`python -m vit_train` is `vit-train`, and `vit_train.cli.commands.eval_main` is `vit-eval` (the
device machine has the code but no installed console scripts).
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]  # the checkout: vit_train/ and configs/
CHILD = Path(__file__).resolve().parent / "child.py"


def finite(value: Any) -> float | None:
    """A JSON-safe number: NaN and infinities become None (JSON has no NaN)."""
    if value is None or isinstance(value, bool):
        return value
    value = float(value)
    return value if math.isfinite(value) else None


class Recorder:
    """One part's checks, figures and notes, rewritten to `path` after every entry, so a part that
    fails or is killed at the end of its time box leaves everything it had found."""

    def __init__(self, path: Path, work: Path, deadline: float, smoke: bool, device: str):
        self.path, self.work, self.deadline, self.smoke, self.device = Path(path), Path(work), deadline, smoke, device
        self.data: dict[str, Any] = {"checks": {}, "figures": {}, "notes": []}
        self.work.mkdir(parents=True, exist_ok=True)
        self.flush()

    @property
    def cuda(self) -> bool:
        return self.device == "cuda"

    def left(self) -> float:
        """Seconds until this part's soft deadline."""
        return self.deadline - time.time()

    def check(self, key: str, ok: bool, label: str, detail: str = "") -> bool:
        self.data["checks"][key] = {"ok": bool(ok), "label": label, "detail": detail}
        self.flush()
        return bool(ok)

    def figure(self, key: str, value: Any, unit: str, label: str, detail: str = "", table: bool = True) -> None:
        """A measured number; `detail`: context shown beside it; `table=False`: in the JSON only."""
        self.data["figures"][key] = {"value": finite(value), "unit": unit, "label": label, "detail": detail,
                                     "table": table}
        self.flush()

    def note(self, text: str) -> None:
        self.data["notes"].append(text)
        self.flush()

    def set(self, key: str, value: Any) -> None:
        self.data[key] = value
        self.flush()

    def flush(self) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(self.data, indent=2, allow_nan=False) + "\n")
        os.replace(tmp, self.path)


@dataclass
class Done:
    """A finished command: exit status (None when killed at its time limit), output, seconds."""

    returncode: int | None
    stdout: str
    stderr: str
    seconds: float

    def tail(self, lines: int = 3) -> str:
        text = (self.stderr.strip() or self.stdout.strip()).splitlines()
        return " | ".join(text[-lines:]) if text else f"exit {self.returncode}"


def run_command(argv: list[str], cwd: Path, timeout: float, log: Path | None = None, grace: float = 20.0,
                env: dict[str, str] | None = None) -> Done:
    """Run `argv` in its own process group (its loader workers and torchrun's children too), which
    is stopped at `timeout` seconds (SIGTERM, then SIGKILL after `grace`). With `log`, the output
    is appended there as well; `env` adds to this process's environment."""
    start = time.time()
    proc = start_group(argv, cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       env={**os.environ, **env} if env else None)
    try:
        out, err = proc.communicate(timeout=max(timeout, 1))
        code = proc.returncode
    except subprocess.TimeoutExpired:
        stop_group(proc, grace)
        out, err = proc.communicate()
        code = None
    finally:
        RUNNING.discard(proc)
    if log is not None:
        with open(log, "a") as f:
            f.write(f"$ {' '.join(argv)}\n{out}{err}(exit {code}, {time.time() - start:.1f} s)\n\n")
    return Done(code, out, err, time.time() - start)


RUNNING: set[subprocess.Popen] = set()  # this process's command groups, ended with it (end_running)


def start_group(argv: list[str], cwd: Path, **popen) -> subprocess.Popen:
    """Popen in a new process group (a session), so the command's own children can be stopped with it."""
    proc = subprocess.Popen(argv, cwd=cwd, start_new_session=True, **popen)
    RUNNING.add(proc)
    return proc


def end_running(signum: int, frame) -> None:
    """SIGTERM handler of a part's process: kill the command groups it started, then exit (its
    results file already holds what it found). The children are also looked up in /proc, for a
    command started but not yet in RUNNING when the signal came."""
    groups = {proc.pid for proc in RUNNING} | set(children(os.getpid()))
    for pid in groups:
        try:
            os.killpg(pid, signal.SIGKILL)  # a command's group id is its pid (a new session)
        except (ProcessLookupError, PermissionError):
            pass  # not a group leader (a DataLoader worker: it is in this process's group) or gone
    os._exit(128 + signum)


def children(parent: int) -> list[int]:
    """Pids of `parent`'s child processes (Linux /proc; none elsewhere)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()  # after "(command name)": state, ppid, ...
        except (OSError, IndexError):
            continue
        if int(fields[1]) == parent:
            found.append(int(stat.parent.name))
    return found


def stop_group(proc: subprocess.Popen, grace: float = 20.0) -> None:
    """SIGTERM to the process group (vit-train checkpoints and stops), then SIGKILL after `grace` s."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def vit_train(*overrides: str) -> list[str]:
    return [sys.executable, "-m", "vit_train", *overrides]


def vit_train_injected(nan_at: int | None, stop_at: int | None, *overrides: str) -> list[str]:
    """vit-train with a NaN training batch at global batch `nan_at` and/or a SIGTERM to itself while
    fetching batch `stop_at` (0-based; the on-device pipeline's batches), see child.launch."""
    flags = [f"--nan-at={nan_at}"] * (nan_at is not None) + [f"--stop-at={stop_at}"] * (stop_at is not None)
    return [sys.executable, str(CHILD), "launch", *flags, "--", *overrides]


def vit_eval(*args: str) -> list[str]:
    return [sys.executable, "-c", "from vit_train.cli.commands import eval_main; eval_main()", *args]


def torchrun(*args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1", *args]


def read_metrics(run_dir: Path, split: str) -> list[dict]:
    """The run's metrics.jsonl entries of one split ("train", "val")."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return []
    entries = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [e for e in entries if e.get("split") == split]


def read_results(run_dir: Path) -> dict:
    path = Path(run_dir) / "results.json"
    return json.loads(path.read_text()) if path.exists() else {}
