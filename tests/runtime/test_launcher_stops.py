"""Stopping several processes as one: `vit-train --nproc_per_node=2 ...` (torchrun's launcher in vit-train's own
process) on a terminal, Ctrl-C or SIGTERM to its process group after the first checkpoint: the command exits
130 or 143 as one process does, with one stop line (rank 0's, on its own line, not on the progress bar), no
traceback and no line of torchrun's agent, and last.pt at the step that line names. And the parts: which
arguments are torchrun's, and only rank 0 of several says what a stop signal does."""

import fcntl
import logging
import os
import signal
import struct
import subprocess
import sys
import termios
import threading
import time

import pytest
import torch

from helpers.files import read_results
from helpers.two_processes import TINY
from vit_train.cli.torchrun import launcher_options
from vit_train.runtime.preemption import StopRequest

ARGS = [*(a for a in TINY if a != "trainer.progress=false"), "trainer.epochs=30"]  # 8 steps an epoch, 240 steps


def on_a_terminal(args: list[str], cwd) -> tuple[subprocess.Popen, list[bytes], threading.Thread]:
    """`python -m vit_train ARGS` with a pseudo-terminal as its stdout and stderr (so rank 0 draws tqdm's bar), in
    a process group of its own; the output so far, read by a thread until every process has closed it."""
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))  # a width for the bar
    proc = subprocess.Popen([sys.executable, "-m", "vit_train", *args], cwd=cwd, stdin=subprocess.DEVNULL,
                            stdout=slave, stderr=slave, start_new_session=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"})
    os.close(slave)
    chunks: list[bytes] = []

    def read() -> None:
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: no process holds the terminal any more
                break
            if not data:
                break
            chunks.append(data)
        os.close(master)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    return proc, chunks, reader


@pytest.mark.slow  # ~15 s each on 2 shared cores: torchrun's launcher and two processes
@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["ctrl-c", "sigterm"])
def test_a_stop_signal_to_the_command_ends_it_as_one_process(tmp_path, sig, code):
    run = tmp_path / "run"
    proc, chunks, reader = on_a_terminal(["--nproc_per_node=2", *ARGS, f"hydra.run.dir={run}"], tmp_path)
    deadline = time.time() + 240
    while not list((run / "checkpoints").glob("step_*.pt")):  # the first checkpoint: the end of epoch 1
        assert proc.poll() is None and time.time() < deadline, b"".join(chunks).decode(errors="replace")[-3000:]
        time.sleep(0.05)
    os.killpg(proc.pid, sig)  # as a terminal's Ctrl-C, or a cluster's SIGTERM, reaches the foreground group
    proc.wait(timeout=120)
    reader.join(timeout=30)
    output = b"".join(chunks).decode(errors="replace")
    assert proc.returncode == code, output[-3000:]
    assert "Traceback" not in output and "SignalException" not in output, output[-3000:]
    assert "death signal" not in output and "closing signal" not in output, output[-3000:]  # torchrun's agent
    name = sig.name
    # each line as the terminal shows it: what follows its last carriage return (a bar redrawn, or cleared)
    shown = [line.rstrip("\r").split("\r")[-1] for line in output.split("\n")]
    said = [line for line in shown if f"received {name}" in line]
    assert said == [f"received {name}: checkpointing after this step, then stopping (Ctrl-C again to stop at once)"], \
        output[-3000:]  # rank 0 alone, on a line of its own
    stops = [line for line in shown if f"stopped by {name}" in line]
    assert len(stops) == 1 and stops[0].startswith(f"vit-train: stopped by {name} at step "), output[-3000:]
    assert [line for line in shown if line.strip()][-1] == stops[0]  # the last line
    assert stops[0].endswith(f"continue with: vit-train --nproc_per_node=2 resume={run}"), stops[0]
    step = int(stops[0].split(" at step ")[1].split(";")[0])
    results = read_results(run)
    saved = torch.load(run / "checkpoints" / "last.pt", weights_only=True)
    assert results["status"] == "interrupted" and saved["step"] == results["steps"] == step
    assert 8 <= step < 240


def test_torchruns_options_are_taken_from_the_command_line_and_the_rest_kept_in_order(monkeypatch):
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    args = ["--nproc_per_node=2", "model=vit_tiny", "--nnodes", "1", "--standalone", "--cfg", "job",
            "--max-restarts=3", "trainer.epochs=2"]
    assert launcher_options(args) == (["--nproc_per_node=2", "--nnodes", "1", "--standalone", "--max-restarts=3"],
                                      ["model=vit_tiny", "--cfg", "job", "trainer.epochs=2"])
    plain = ["-m", "optim.lr=1e-3,5e-4", "--multirun", "--help", "--config-dir=extra"]
    assert launcher_options(plain) == ([], plain)  # vit-train's (Hydra's) own flags stay vit-train's
    monkeypatch.setenv("LOCAL_RANK", "0")  # a process torchrun started: nothing is torchrun's any more
    assert launcher_options(["--nproc_per_node=2"]) == ([], ["--nproc_per_node=2"])


@pytest.mark.parametrize("rank, said", [("0", True), ("1", False)])
def test_of_several_processes_only_rank_0_says_what_a_stop_signal_does(monkeypatch, caplog, rank, said):
    monkeypatch.setenv("RANK", rank)
    with caplog.at_level(logging.WARNING, logger="vit_train"), StopRequest(deferred=True) as stop:
        stop._handle(signal.SIGTERM, None)  # this process received it
        stop.agree(signal.SIGTERM)
    assert stop.exit_code == 143
    assert [r.getMessage().split(":")[0] for r in caplog.records] == (["received SIGTERM"] if said else [])
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="vit_train"), StopRequest(deferred=True) as stop:
        stop.agree(signal.SIGUSR1)  # another process received it
    assert [r.getMessage().split(":")[0] for r in caplog.records] == (["another process received SIGUSR1"] if said
                                                                      else [])
    monkeypatch.delenv("RANK")
    with caplog.at_level(logging.WARNING, logger="vit_train"), StopRequest() as stop:
        stop._handle(signal.SIGINT, None)  # one process: it says so, as ever
    assert caplog.records[-1].getMessage().startswith("received SIGINT")
