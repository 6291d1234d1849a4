"""The default CPU thread count on a busy machine (docs/speed.md, "CPU threads per process"): the CPUs
this process may use, less those other processes keep busy at start, shared among the run's
processes. Every input is forced (affinity, /proc/stat, this process's CPU time, the load), so each
oracle is exact; scripts/bench_threads.py measures what the choice is worth."""

from __future__ import annotations

import os

import pytest

from vit_train.runtime import cpu
from vit_train.runtime.cpu import (busy_cpus, cpu_threads, cpu_ticks, load_of_others, process_age, recent_load,
                                   share_of_cpus)


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


def test_the_load_average_counts_without_this_processes_own_part():
    assert load_of_others(2.0, own_cpu_seconds=0.0, age_seconds=30.0) == 2.0    # this process was idle
    assert load_of_others(2.0, own_cpu_seconds=9.0, age_seconds=None) == 2.0    # its age unknown: all others'
    assert load_of_others(3.0, own_cpu_seconds=12000.0, age_seconds=6000.0) == 1.0  # long-lived, 2 CPUs' worth
    # a command 6 s old that computed all along has added 1 - exp(-0.1) of one CPU to the average
    assert load_of_others(2.0, own_cpu_seconds=6.0, age_seconds=6.0) == pytest.approx(1.9048374180359595, abs=1e-12)
    assert load_of_others(0.5, own_cpu_seconds=12000.0, age_seconds=6000.0) == 0.0  # never below 0


def test_process_age_comes_from_proc(tmp_path):
    (tmp_path / "self").mkdir()
    # pid (comm with ") " in it) state, then fields 4..21, then field 22: starttime in ticks since boot
    (tmp_path / "self" / "stat").write_text("42 (a) b) S " + " ".join(["0"] * 18) + f" {500 * os.sysconf('SC_CLK_TCK')} 7 8\n")
    (tmp_path / "uptime").write_text("512.25 1000.00\n")
    assert process_age(tmp_path) == 12.25
    assert process_age(tmp_path / "absent") is None


def test_the_load_average_is_read_only_when_the_process_may_use_the_whole_machine(monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    monkeypatch.setattr(os, "getloadavg", lambda: (3.5, 1.0, 1.0))
    monkeypatch.setattr(cpu, "process_age", lambda: None)
    assert recent_load({0, 1, 2, 3}) == 3.5
    assert recent_load({0, 1}) == 0.0  # taskset or a cpuset: the machine's load says nothing of these CPUs


@pytest.fixture
def two_cpus(monkeypatch):
    """A process allowed CPUs 0 and 1, no thread settings in the environment, no cgroup quota; the
    busy CPUs its sample would find and the load average's count of others are set with
    `two_cpus(busy, load)`, which returns the CPU sets sampled."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr(cpu, "usable_cpus", lambda: len(os.sched_getaffinity(0)))
    sampled_cpus = []

    def busy(value, load=0.0):
        def sample(cpus):
            sampled_cpus.append(cpus)
            return value
        monkeypatch.setattr(cpu, "busy_cpus", sample)
        monkeypatch.setattr(cpu, "recent_load", lambda cpus: load)
        return sampled_cpus
    return busy


def test_the_default_leaves_out_the_cpus_other_processes_keep_busy(two_cpus):
    sampled_cpus = two_cpus(0.2)
    assert cpu_threads() == (2, "2 CPUs / 1 process of this run")
    assert sampled_cpus == [{0, 1}]  # the sample covers the CPUs this process may use
    two_cpus(1.94)
    assert cpu_threads() == (1, "2 CPUs / 1 process of this run; other processes keep 1.9 of them busy")
    two_cpus(0.7)
    assert cpu_threads() == (1, "2 CPUs / 1 process of this run; other processes keep 0.7 of them busy")


def test_the_last_minutes_load_counts_when_the_sample_falls_in_a_pause(two_cpus):
    two_cpus(0.1, load=2.6)  # a pause in the other work: a sample alone chose 2 threads (docs/speed.md)
    assert cpu_threads() == (1, "2 CPUs / 1 process of this run; other processes keep 2.6 of them busy")
    two_cpus(1.5, load=0.2)  # work that has just started: the sample sees it, the average not yet
    assert cpu_threads() == (1, "2 CPUs / 1 process of this run; other processes keep 1.5 of them busy")
    two_cpus(0.1, load=0.3)
    assert cpu_threads() == (2, "2 CPUs / 1 process of this run")


def test_a_setting_the_environment_or_a_one_cpu_share_need_no_sample(two_cpus, monkeypatch):
    calls = two_cpus(2.0, load=2.0)
    assert cpu_threads(2) == (2, "trainer.cpu_threads")  # the user's word, even on a busy machine
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert cpu_threads() == (2, "OMP_NUM_THREADS")
    monkeypatch.delenv("OMP_NUM_THREADS")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")  # one CPU per process: one thread whatever the load
    assert cpu_threads() == (1, "2 CPUs / 2 processes of this run")
    assert calls == []


def test_a_resumed_run_keeps_the_count_it_was_trained_with(two_cpus, monkeypatch, tmp_path):
    """The count changes a CPU run's last bits: a resume on a machine busier (or quieter) than at the
    start must not pick another one, or it is no longer exact. The user's setting still wins."""
    calls = two_cpus(2.0, load=2.0)  # now busy: the default would say 1
    assert cpu_threads(None, resumed=2) == (2, "as the run was trained with, for an exact resume")
    assert cpu_threads(1, resumed=2) == (1, "trainer.cpu_threads")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert cpu_threads(None, resumed=2) == (1, "OMP_NUM_THREADS")
    assert calls == []


def test_a_checkpoint_records_the_thread_count(tmp_path, monkeypatch):
    import torch

    from helpers.configs import tiny_config
    from vit_train.train.trainer import train

    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    train(tiny_config(data={"train_size": 64, "val_size": 32, "batch_size": 32}, trainer={"max_steps": 1}), tmp_path)
    assert torch.load(tmp_path / "checkpoints" / "last.pt", weights_only=True)["cpu_threads"] == 2


@pytest.mark.parametrize("value, count", [("4,2", 4), (" 3", 3), ("", None), ("0", None), ("x", None), (None, None)])
def test_counts_from_the_environment_take_openmps_nested_form_and_ignore_empty_ones(monkeypatch, value, count):
    """OMP_NUM_THREADS=4,2 (OpenMP's nested levels) was ignored; LOCAL_WORLD_SIZE= (empty) was a traceback."""
    from vit_train.runtime.cpu import env_count

    if value is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", value)
    assert env_count("OMP_NUM_THREADS") == count


def test_an_empty_local_world_size_is_one_process(two_cpus, monkeypatch):
    two_cpus(0.0)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "")
    assert cpu_threads() == (2, "2 CPUs / 1 process of this run")


def test_the_load_average_counts_at_most_the_cpus_it_covers(monkeypatch):
    """A 1-minute load of 6 on 2 CPUs was said as 'other processes keep 5.5 of them busy'."""
    monkeypatch.setattr(os, "getloadavg", lambda: (6.0, 6.0, 6.0))
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setattr(cpu, "process_age", lambda: None)  # this process's own share: none taken off (forced)
    assert recent_load({0, 1}) == 2.0


def test_the_load_average_takes_a_cpu_only_from_a_whole_one(two_cpus):
    """Work that ended a minute ago (a 1-minute load of 0.71 on an idle machine) chose 1 thread where 2
    ran 1.4x faster (scripts/bench_threads.py); a sample still counts a CPU from half of it."""
    two_cpus(0.05, load=0.71)
    assert cpu_threads() == (2, "2 CPUs / 1 process of this run")
    two_cpus(0.05, load=1.0)
    assert cpu_threads() == (1, "2 CPUs / 1 process of this run; other processes keep 1.0 of them busy")
    two_cpus(0.6, load=0.2)
    assert cpu_threads() == (1, "2 CPUs / 1 process of this run; other processes keep 0.6 of them busy")
