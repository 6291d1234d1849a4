"""CPU threads per process: torch's intra-op threads from the share of the machine a process has.

Torch's default is one thread per CPU in every process, so several processes on one machine
(parallel sweep jobs, torchrun processes, two runs on a workstation, other people's jobs)
oversubscribe it: a thread that the OS has descheduled for another process holds up every parallel
operation, its siblings spin waiting at the operation's end, and a step of a small model can run
many times slower than with fewer threads (measured in docs/speed.md). So the default counts the
CPUs this process may use (affinity mask, cgroup quota), divides them among this run's processes
on the node, and leaves out the CPUs that other processes keep busy at start.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import torch

log = logging.getLogger("vit_train")

# Busy CPUs are rounded to whole ones taken by other work, from this share of a CPU on: a thread
# sharing a CPU with a process that runs half the time or more stalls every operation's barrier.
TAKEN = 0.5
SAMPLE_SECONDS = 0.25  # how long the other processes' CPU use is sampled at start


def usable_cpus(cgroup: Path = Path("/sys/fs/cgroup/cpu.max")) -> int:
    """CPUs this process may use: its affinity mask (taskset, SLURM's cpuset) capped by a cgroup v2
    CPU quota (docker --cpus, Kubernetes limits), which the OS's CPU count does not see."""
    cpus = len(_affinity())
    try:
        quota, period = cgroup.read_text().split()[:2]
        if quota != "max":
            cpus = min(cpus, max(1, math.ceil(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return cpus


def _affinity() -> set[int]:
    if hasattr(os, "sched_getaffinity"):
        return set(os.sched_getaffinity(0))
    return set(range(os.cpu_count() or 1))


def cpu_ticks(cpus: Iterable[int], stat: Path = Path("/proc/stat")) -> tuple[int, int] | None:
    """(busy, total) clock ticks since boot, summed over the CPUs numbered `cpus`, from Linux's
    /proc/stat (busy: user, nice, system, irq, softirq and steal, the time a hypervisor gave the CPU
    to another machine; total adds idle and iowait). None where the file is absent or unreadable
    (not Linux) or lists none of the CPUs."""
    wanted, busy, total = {f"cpu{n}" for n in cpus}, 0, 0
    try:
        for line in stat.read_text().splitlines():
            fields = line.split()
            if fields and fields[0] in wanted:
                ticks = [int(v) for v in fields[1:9]] + [0] * (9 - len(fields))
                user, nice, system, idle, iowait, irq, softirq, steal = ticks[:8]
                busy += user + nice + system + irq + softirq + steal
                total += user + nice + system + idle + iowait + irq + softirq + steal
    except (OSError, ValueError):
        return None
    return (busy, total) if total else None


def busy_cpus(
    cpus: set[int],
    seconds: float = SAMPLE_SECONDS,
    ticks: Callable[[set[int]], tuple[int, int] | None] = cpu_ticks,
    own_seconds: Callable[[], float] = lambda: sum(os.times()[:2]),
    sleep: Callable[[float], None] = time.sleep,
    hz: int | None = None,
) -> float:
    """How many of the CPUs `cpus` other processes keep busy (0.0 to len(cpus)), from a sample of
    `seconds`: the busy clock ticks on those CPUs (`ticks`, `hz` a second) less this process's own
    CPU time (all its threads), over the ticks that passed; 0.0 where it cannot be measured. A point
    in time, not a forecast: work that starts later is not seen."""
    hz = hz or (os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100)
    own, before = own_seconds(), ticks(cpus)
    sleep(seconds)
    after, own = ticks(cpus), own_seconds() - own
    if before is None or after is None or after[1] <= before[1]:
        return 0.0
    busy, total = after[0] - before[0] - own * hz, after[1] - before[1]
    return min(float(len(cpus)), max(0.0, busy / total * len(cpus)))


def load_of_others(load: float, own_cpu_seconds: float, age_seconds: float | None) -> float:
    """The 1-minute load average `load` (runnable tasks, an exponential average over about a minute)
    less this process's estimated part in it: its CPU time over its age as a steady rate, weighted as
    the average weighs the process's `age_seconds` (a fresh command has added little; a long-lived
    process, a benchmark or a sweep running jobs one after another in one process, its full rate).
    An unknown age (None) counts nothing as this process's. At least 0."""
    if not age_seconds or age_seconds <= 0:
        return max(0.0, load)
    rate = own_cpu_seconds / age_seconds
    return max(0.0, load - rate * (1 - math.exp(-age_seconds / 60)))


def process_age(proc: Path = Path("/proc")) -> float | None:
    """Seconds since this process started, from Linux's /proc (None elsewhere)."""
    try:
        fields = (proc / "self" / "stat").read_text().rsplit(")", 1)[1].split()
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22, starttime, in ticks since boot
        return float((proc / "uptime").read_text().split()[0]) - started
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def recent_load(cpus: set[int]) -> float:
    """CPUs other processes kept busy over the last minute, from the load average: only where `cpus`
    (this process's affinity) is the whole machine, which is what the load average counts; else 0.0.
    It sees steady work that a short sample may catch in a pause (tests between two steps, jobs
    waiting on a file), and it counts tasks waiting on a disk too, so it errs toward fewer threads."""
    if not hasattr(os, "getloadavg") or len(cpus) != (os.cpu_count() or 0):
        return 0.0
    return min(float(len(cpus)), load_of_others(os.getloadavg()[0], sum(os.times()[:2]), process_age()))


def share_of_cpus(usable: int, affinity: int, busy: float, processes: int) -> int:
    """Threads for one of `processes` processes of a run: `usable` CPUs (affinity capped by the
    quota) without those that other work keeps busy (`busy` CPUs of the `affinity` ones the sample
    covered, rounded up from TAKEN of a CPU on), divided among the processes, at least 1."""
    taken = math.floor(busy + 1 - TAKEN)
    free = min(usable, max(0, affinity - taken))
    return max(1, free // max(1, processes))


def env_count(name: str) -> int | None:
    """A positive count from the environment variable `name` (its first comma-separated field, spaces
    ignored), None when it is unset, empty or not one."""
    first = os.environ.get(name, "").split(",")[0].strip()
    return int(first) if first.isdigit() and int(first) > 0 else None


def cpu_threads(setting: int | None = None, resumed: int | None = None) -> tuple[int, str]:
    """(torch intra-op threads for this process, why).

    `trainer.cpu_threads` when set; else OMP_NUM_THREADS when the environment sets it (the user,
    torchrun, or joblib's workers in a `hydra/launcher=parallel` sweep, which get CPUs // n_jobs);
    else, for a resumed run, `resumed`: the count its checkpoint was trained with (another count
    changes a CPU run's last bits, so a resume would not be exact); else this process's share: usable CPUs (affinity and quota) less those other processes keep
    busy, the more of a short sample at start (`busy_cpus`) and the last minute's load average
    (`recent_load`), divided by the processes of this run on the node (LOCAL_WORLD_SIZE), at least
    1. (Loader workers run one thread each, as torch sets them.)
    """
    if setting:
        return setting, "trainer.cpu_threads"
    omp = env_count("OMP_NUM_THREADS")  # OpenMP's nested form "4,2": the outer level's
    if omp:
        return omp, "OMP_NUM_THREADS"
    if resumed:
        return resumed, "as the run was trained with, for an exact resume"
    cpus, local = usable_cpus(), max(1, env_count("LOCAL_WORLD_SIZE") or 1)
    affinity = _affinity()
    sample, load = (busy_cpus(affinity), recent_load(affinity)) if cpus > local else (0.0, 0.0)  # else one thread
    busy = max(sample, load)
    why = f"{cpus} CPUs / {local} process{'es' if local > 1 else ''} of this run"
    # the load average counts a CPU only from a whole one: it lags, and work that ended a minute ago (0.7
    # of a CPU) must not halve an idle machine's threads; a sample counts one from TAKEN of it on
    threads = share_of_cpus(cpus, len(affinity), max(sample, load - (1 - TAKEN)), local)
    if threads < max(1, cpus // local):
        why += f"; other processes keep {busy:.1f} of them busy"
    return threads, why


def set_cpu_threads(setting: int | None = None, resumed: int | None = None, said: list[str] | None = None) -> int:
    """Apply `cpu_threads` to torch and log it (or, with `said`, append the line to it, for the caller to log
    once the data is known to load: a refusal is then the only line); returns the thread count."""
    threads, why = cpu_threads(setting, resumed)
    torch.set_num_threads(threads)
    line = f"CPU threads: {threads} ({why}; trainer.cpu_threads=N to change)"
    if said is None:
        log.info("%s", line)
    else:
        said.append(line)
    return threads
