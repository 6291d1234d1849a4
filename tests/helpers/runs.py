"""The real commands in a subprocess, output captured as text: `vit_train` (python -m vit_train),
`command` (vit-eval, vit-predict, vit-export, ... by name), `vit_sweep_summary`, `torchrun`; and
another process that holds a run directory's lock (`hold_lock`, `lock_is_free`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def vit_train(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """`python -m vit_train ARGS` in `cwd`, its output captured."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run([sys.executable, "-m", "vit_train", *args], cwd=cwd, capture_output=True, text=True,
                          env=env, timeout=300)


def start_vit_train(*args: str, cwd: Path, **popen) -> subprocess.Popen:
    """`python -m vit_train ARGS` in `cwd`, started and not waited for; `popen`: Popen's stdout, stderr,
    start_new_session..."""
    return subprocess.Popen([sys.executable, "-m", "vit_train", *args], cwd=cwd, text=True, **popen)


def command(name: str, *args: str) -> subprocess.CompletedProcess:
    """The entry point `vit-NAME ARGS` (name: eval, predict, export, inspect, ...; vit_train.cli.commands'
    NAME_main), its output captured."""
    code = f"import sys; from vit_train.cli.commands import {name}_main as m; sys.argv[0] = 'x'; m()"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=300)


def vit_sweep_summary(*args: str) -> subprocess.CompletedProcess:
    """`vit-sweep-summary ARGS`, its output captured."""
    return subprocess.run([sys.executable, "-c", "from vit_train.sweeps.summary import main; main()", *args],
                          capture_output=True, text=True)


def torchrun(*args: str, cwd: Path, nproc: int = 2, restarts: int = 0, wait: bool = True, **popen):
    """`torchrun --standalone --nproc_per_node=NPROC -m vit_train ARGS` in `cwd` (one thread a process):
    its CompletedProcess (output captured), or with wait=False the started Popen (stderr into stdout;
    `popen` adds Popen's keywords, e.g. start_new_session=True)."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
               f"--max-restarts={restarts}", "-m", "vit_train", *args]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    if not wait:
        return subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                **popen)
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def hold_lock(path: Path) -> subprocess.Popen:
    """Another process holding the run-directory lock on `path` (vit_train/outputs/rundir.py) until killed."""
    holder = subprocess.Popen([sys.executable, "-c", "import sys; from vit_train.outputs import rundir; "
                               f"rundir.acquire({str(path)!r}); print('locked', flush=True); sys.stdin.read()"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline() == "locked\n"
    return holder


def lock_is_free(path: Path) -> bool:
    """Whether another process could take the lock on `path` now (it tries, in a subprocess, and lets go)."""
    probe = subprocess.run([sys.executable, "-c", f"from vit_train.outputs import rundir; rundir.acquire({str(path)!r})"],
                           capture_output=True, text=True)
    assert probe.returncode == 0 or "is in use by another vit-train run" in probe.stderr, probe.stderr
    return probe.returncode == 0
