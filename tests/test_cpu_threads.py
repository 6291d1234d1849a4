"""The default CPU thread count on a busy machine (docs/speed.md, "CPU threads per process"): the CPUs
this process may use, less those other processes keep busy at start, shared among the run's
processes. Every input is forced (affinity, /proc/stat, this process's CPU time, the load), so each
oracle is exact; scripts/bench_threads.py measures what the choice is worth."""

from __future__ import annotations

import os

import pytest

from vit_train.runtime import cpu
from vit_train.runtime.cpu import busy_cpus, cpu_threads, cpu_ticks, share_of_cpus


@pytest.mark.parametrize("usable, affinity, busy, processes, threads", [
    (2, 2, 0.0, 1, 2),     # an idle 2-core machine: both
    (2, 2, 0.49, 1, 2),    # less than half a CPU of other work does not take one
    (2, 2, 0.5, 1, 1),     # from half a CPU on it does
    (2, 2, 1.0, 1, 1),     # one busy process beside: the quick start's 29-minute case had 2 threads here
    (2, 2, 2.0, 1, 1),     # two busy processes: never below one thread
    (2, 2, 2.5, 1, 1),     # load 2.5 on 2 cores
    (8, 8, 1.6, 1, 6),     # 1.6 busy CPUs count as 2
    (8, 8, 2.0, 3, 2),     # what is left is shared among the run's processes (LOCAL_WORLD_SIZE)
    (8, 8, 7.0, 3, 1),
    (2, 64, 30.0, 1, 2),   # docker --cpus=2 on a 64-CPU host half busy with other containers: the quota binds
    (2, 64, 63.0, 1, 1),   # ... and on a host with one free CPU, the host binds
])
def test_threads_are_the_usable_cpus_less_the_busy_ones_shared_among_the_run(usable, affinity, busy, processes,
                                                                               threads):
    assert share_of_cpus(usable, affinity, busy, processes) == threads


def test_cpu_ticks_sum_the_busy_and_all_ticks_of_the_cpus_the_process_may_use(tmp_path):
    stat = tmp_path / "stat"
    #                 user nice system idle iowait irq softirq steal guest guest_nice
    stat.write_text("cpu  100 0 100 800 0 0 0 0 0 0\n"
                    "cpu0 10 1 2 100 7 3 4 5 0 0\n"
                    "cpu1 20 0 0 80 0 0 0 0 0 0\n"
                    "cpu10 1000 0 0 0 0 0 0 0 0 0\n"      # not cpu1: the names are compared whole
                    "cpu2 5 0 0 5\n"                       # an old kernel's four fields
                    "intr 1 2 3\n")
    assert cpu_ticks({0}, stat) == (10 + 1 + 2 + 3 + 4 + 5, 10 + 1 + 2 + 100 + 7 + 3 + 4 + 5)
    assert cpu_ticks({0, 1}, stat) == (25 + 20, 132 + 100)
    assert cpu_ticks({1, 2}, stat) == (25, 110)
    assert cpu_ticks({7}, stat) is None                    # a CPU the file does not list
    assert cpu_ticks({0}, tmp_path / "absent") is None     # not Linux
    stat.write_text("cpu0 x y\n")
    assert cpu_ticks({0}, stat) is None


def sampled(readings, own=(0.0, 0.0), cpus=(0, 1)):
    """busy_cpus over forced tick readings and this process's CPU seconds, 100 ticks a second."""
    ticks, seconds = iter(readings), iter(own)
    return busy_cpus(set(cpus), 0.25, ticks=lambda _: next(ticks), own_seconds=lambda: next(seconds),
                     sleep=lambda _: None, hz=100)


def test_busy_cpus_are_the_busy_share_of_the_sample_less_this_process():
    assert sampled([(1000, 4000), (1050, 4050)]) == 2.0            # 2 CPUs, 25 ticks each, all busy
    assert sampled([(1000, 4000), (1025, 4050)]) == 1.0
    assert sampled([(1000, 4000), (1000, 4050)]) == 0.0
    assert sampled([(1000, 4000), (1050, 4050)], own=(3.0, 3.25)) == 1.0  # our own 25 ticks are not others'
    assert sampled([(1000, 4000), (1010, 4050)], own=(3.0, 3.5)) == 0.0   # never below 0
    assert sampled([(1000, 4000), (1050, 4050)], cpus=(0,)) == 1.0        # never above the CPUs sampled
    assert sampled([None, None]) == 0.0                                    # no /proc/stat: nothing known
    assert sampled([(1000, 4000), (1000, 4000)]) == 0.0                    # no tick passed


@pytest.fixture
def two_cpus(monkeypatch, tmp_path):
    """A process allowed CPUs 0 and 1, no thread settings in the environment, no cgroup quota; the
    busy CPUs its sample would find are set with `two_cpus(busy)`."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr(cpu, "usable_cpus", lambda: len(os.sched_getaffinity(0)))
    sampled_cpus = []

    def busy(value):
        def sample(cpus):
            sampled_cpus.append(cpus)
            return value
        monkeypatch.setattr(cpu, "busy_cpus", sample)
        return sampled_cpus
    return busy


def test_the_default_leaves_out_the_cpus_other_processes_keep_busy(two_cpus):
    sampled_cpus = two_cpus(0.2)
    assert cpu_threads() == (2, "2 CPUs / 1 process of this run")
    assert sampled_cpus == [{0, 1}]  # the sample covers the CPUs this process may use
    two_cpus(1.94)
    assert cpu_threads() == (1, "2 CPUs / 1 process of this run; 1.9 CPUs busy with other processes at start")
    two_cpus(0.7)
    assert cpu_threads() == (1, "2 CPUs / 1 process of this run; 0.7 CPUs busy with other processes at start")


def test_a_setting_the_environment_or_a_one_cpu_share_need_no_sample(two_cpus, monkeypatch):
    calls = two_cpus(2.0)
    assert cpu_threads(2) == (2, "trainer.cpu_threads")  # the user's word, even on a busy machine
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert cpu_threads() == (2, "OMP_NUM_THREADS")
    monkeypatch.delenv("OMP_NUM_THREADS")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")  # one CPU per process: one thread whatever the load
    assert cpu_threads() == (1, "2 CPUs / 2 processes of this run")
    assert calls == []
