"""The stop and fault guarantees under trainer.strategy=fsdp (2 processes, gloo): a SIGTERM to the process
group and a kill -9 of one process both resume to the uninterrupted FSDP run, bit for bit (the same
world size and strategy: the same reduce-scatters in the same order)."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest
import torch

from helpers.files import logged, model_weights, read_results
from helpers.runs import torchrun
from helpers.two_processes import TINY

# 32 steps, with drop path: each process seeds its RNG from (seed, step, rank) before each step
# (train/trainer.py step_seed), so a resumed run draws the uninterrupted run's masks.
ARGS = [*TINY, "trainer.strategy=fsdp", "trainer.epochs=4", "trainer.ema_decay=0.9", "optim.clip_grad=0.05",
        "model.drop_path=0.2"]


def _assert_as_whole(run, whole):
    assert [(e["step"], e["loss"]) for e in logged(run, "train")] == [(e["step"], e["loss"])
                                                                      for e in logged(whole, "train")]
    for name in ("model", "ema", "optimizer"):
        a = torch.load(whole / "checkpoints" / "last.pt", weights_only=True)[name]
        b = torch.load(run / "checkpoints" / "last.pt", weights_only=True)[name]
        if name == "optimizer":
            a = {f"{i}.{k}": v for i, s in a["state"].items() for k, v in s.items()}
            b = {f"{i}.{k}": v for i, s in b["state"].items() for k, v in s.items()}
        assert a.keys() == b.keys()
        assert all(torch.equal(a[k], b[k]) for k in a), name


@pytest.mark.slow  # three torchrun launches
def test_sigterm_to_the_group_stops_fsdp_at_one_step_and_resume_is_the_uninterrupted_run(tmp_path):
    whole = torchrun(*ARGS, "hydra.run.dir=whole", cwd=tmp_path)
    assert whole.returncode == 0, whole.stdout + whole.stderr
    run = tmp_path / "run"
    proc = torchrun(*ARGS, "hydra.run.dir=run", "resume=auto", cwd=tmp_path, wait=False, start_new_session=True)
    deadline = time.time() + 120
    while time.time() < deadline and not (run / "metrics.jsonl").exists() or len(logged(run, "train")) < 5:
        assert proc.poll() is None and time.time() < deadline, proc.communicate()[0]
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGTERM)
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode != 0, output
    stops = [int(line.split(" at step ")[1].split(";")[0]) for line in output.splitlines() if "stopped by SIGTERM" in line]
    assert len(stops) == 1, output  # rank 0 speaks for the group
    saved = torch.load(run / "checkpoints" / "last.pt", weights_only=True)
    assert read_results(run)["status"] == "interrupted" and saved["step"] == stops[0] < 32
    resumed = torchrun(*ARGS, "hydra.run.dir=run", "resume=auto", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    _assert_as_whole(run, tmp_path / "whole")


@pytest.mark.slow  # two torchrun launches, one with a restart
def test_a_killed_fsdp_process_restarts_the_group_which_resumes_as_the_uninterrupted_run(tmp_path):
    whole = torchrun(*ARGS, "trainer.ckpt_every=1", "hydra.run.dir=whole", cwd=tmp_path)
    assert whole.returncode == 0, whole.stdout + whole.stderr
    run = tmp_path / "run"
    proc = torchrun(*ARGS, "trainer.ckpt_every=1", "hydra.run.dir=run", cwd=tmp_path, restarts=1, wait=False)
    deadline = time.time() + 120
    while time.time() < deadline and not list((run / "checkpoints").glob("step_*.pt")):
        time.sleep(0.05)
    workers = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
    assert len(workers) == 2
    os.kill(int(workers[-1]), signal.SIGKILL)
    output, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, output
    assert "restart 1 of the process group" in output and "resumed from" in (run / "train.log").read_text()
    assert read_results(run)["steps"] == 32
    _assert_as_whole(run, tmp_path / "whole")
