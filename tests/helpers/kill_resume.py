"""A run stopped in a child process by tests/helpers/killer.py (a real SIGKILL, or SIGTERM, at one chosen moment:
no clean-up code runs after a kill -9), and its resume, which must end as the uninterrupted run. Shared by
train/test_faults.py, train/test_log_window_resume.py, train/test_resume_matrix.py, train/test_compiled_step.py,
data/test_device_pipeline.py, data/test_hf_data.py and data/test_webdataset_runs.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Callable

from helpers.configs import tiny_config
from helpers.files import assert_every_file_as_the_reference

KILLER = Path(__file__).with_name("killer.py")


def stop_at(run_dir: Path, sections: dict, fault: str = "row", n: int = 1, signal: str = "KILL",
            timeout: int = 300, imports: list[tuple[str, str]] = ()) -> subprocess.CompletedProcess:
    """killer.py trains `tiny_config(**sections)` into `run_dir` in a child process and sends it SIG`signal`
    at the n-th `fault` (killer.py lists them); the child's CompletedProcess, output captured. `imports`: (folder,
    module) pairs the child imports first (a user's own options)."""
    spec = {"run_dir": str(run_dir), "sections": sections, "fault": fault, "n": n, "signal": signal,
            "imports": [list(pair) for pair in imports]}
    return subprocess.run([sys.executable, str(KILLER), json.dumps(spec)], capture_output=True, text=True,
                          timeout=timeout)


def kill_9_at(run_dir: Path, sections: dict, fault: str, n: int, timeout: int = 300,
              imports: list[tuple[str, str]] = ()) -> subprocess.CompletedProcess:
    """stop_at with SIGKILL, asserting that the child died of it."""
    done = stop_at(run_dir, sections, fault, n, "KILL", timeout, imports)
    assert done.returncode == -9, (done.returncode, done.stdout, done.stderr[-2000:])
    return done


def stopped_at_a_row(run_dir: Path, sections: dict, n: int, signal: str, timeout: int = 300) -> None:
    """stop_at after the n-th train row with SIG`signal`: the child ended by it, not by finishing, and left last.pt."""
    done = stop_at(run_dir, sections, "row", n, signal, timeout)
    assert "ended without the fault" not in done.stdout and done.returncode != 0, done.stderr[-2000:]
    assert (Path(run_dir) / "checkpoints" / "last.pt").exists(), done.stderr[-2000:]


def resume_as_the_reference(run_dir: Path, sections: dict, reference: Path) -> None:
    """train(resume=auto) on `run_dir`; then every file a user reads as the uninterrupted `reference`'s."""
    from vit_train.train.trainer import train

    train(tiny_config(**sections, resume="auto"), run_dir)
    assert_every_file_as_the_reference(run_dir, reference)


def stop_then_resume(run_dir: Path, sections: dict, reference: Path, signal: str, n: int = 11, timeout: int = 300,
                     before_resume: Callable[[], object] = lambda: None) -> None:
    """The resume matrix's sequence: stopped after the n-th train row (`stopped_at_a_row`), `before_resume()`,
    then resumed as the uninterrupted `reference` (`resume_as_the_reference`)."""
    stopped_at_a_row(run_dir, sections, n, signal, timeout)
    before_resume()
    resume_as_the_reference(run_dir, sections, reference)
