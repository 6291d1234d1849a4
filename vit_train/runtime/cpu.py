"""CPU threads per process: torch's intra-op threads from the share of the machine a process has.

Torch's default is one thread per CPU in every process, so several processes on one machine
(parallel sweep jobs, torchrun processes, two runs on a workstation) oversubscribe it: threads
spin waiting for each other and a step can run many times slower than with one thread each.
"""

from __future__ import annotations

import logging
import math
import os
from pathlib import Path

import torch

log = logging.getLogger("vit_train")


def usable_cpus(cgroup: Path = Path("/sys/fs/cgroup/cpu.max")) -> int:
    """CPUs this process may use: its affinity mask (taskset, SLURM's cpuset) capped by a cgroup v2
    CPU quota (docker --cpus, Kubernetes limits), which the OS's CPU count does not see."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        quota, period = cgroup.read_text().split()[:2]
        if quota != "max":
            cpus = min(cpus, max(1, math.ceil(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return cpus


def cpu_threads(setting: int | None = None) -> tuple[int, str]:
    """(torch intra-op threads for this process, why).

    `trainer.cpu_threads` when set; else OMP_NUM_THREADS when the environment sets it (the user,
    torchrun, or joblib's workers in a `hydra/launcher=parallel` sweep, which get CPUs // n_jobs);
    else this process's share: usable CPUs divided by the processes of this run on the node
    (LOCAL_WORLD_SIZE), at least 1. (Loader workers run one thread each, as torch sets them.)
    """
    if setting:
        return setting, "trainer.cpu_threads"
    if os.environ.get("OMP_NUM_THREADS", "").isdigit() and int(os.environ["OMP_NUM_THREADS"]) > 0:
        return int(os.environ["OMP_NUM_THREADS"]), "OMP_NUM_THREADS"
    cpus, local = usable_cpus(), max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    return max(1, cpus // local), f"{cpus} CPUs / {local} process{'es' if local > 1 else ''} of this run"


def set_cpu_threads(setting: int | None = None) -> int:
    """Apply `cpu_threads` to torch and log it; returns the thread count."""
    threads, why = cpu_threads(setting)
    torch.set_num_threads(threads)
    log.info("CPU threads: %d (%s; trainer.cpu_threads=N to change)", threads, why)
    return threads
