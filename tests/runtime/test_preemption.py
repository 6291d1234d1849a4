"""Stop signals through the real command line: checkpoint, exit 143/130, and `resume=auto` finishes
exactly like an uninterrupted run."""

import os
import signal
import subprocess
import time

import pytest
import torch

from helpers.configs import TINY
from helpers.files import logged, read_results
from helpers.runs import start_vit_train, vit_train

ARGS = [*TINY, "data.train_size=256", "trainer.epochs=20", "trainer.log_every=1"]  # 8 steps per epoch, 160 steps


def train_losses(run):
    return [(e["step"], e["loss"]) for e in logged(run, "train")]


def wait_for_step(run, step, proc, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline:
        assert proc.poll() is None, proc.communicate()
        if (run / "metrics.jsonl").exists() and any(s >= step for s, _ in train_losses(run)):
            return
        time.sleep(0.01)
    raise AssertionError(f"step {step} not reached")


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    where = tmp_path_factory.mktemp("uninterrupted")
    done = vit_train(*ARGS, f"hydra.run.dir={where / 'run'}", cwd=where)
    assert done.returncode == 0, done.stderr
    return where / "run"


@pytest.mark.parametrize("sig, exit_code, workers", [
    pytest.param(signal.SIGTERM, 143, 2, marks=pytest.mark.slow),  # ~24 s on 2 cores: loader workers; sigint stays fast
    (signal.SIGINT, 130, 0)], ids=["sigterm-2-workers", "sigint"])
def test_stop_signal_then_resume_auto_equals_an_uninterrupted_run(tmp_path, uninterrupted, sig, exit_code, workers):
    run = tmp_path / "run"
    command = [*ARGS, f"data.num_workers={workers}", f"hydra.run.dir={run}", "resume=auto"]
    proc = start_vit_train(*command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           start_new_session=True)
    wait_for_step(run, 3, proc)
    os.killpg(proc.pid, sig)  # the whole process group, loader workers too, as a cluster or a terminal does
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == exit_code, err
    assert "Traceback" not in err and f"last.pt holds it; continue with: vit-train resume={run}" in err
    stopped = read_results(run)
    assert stopped["status"] == "interrupted" and 3 <= stopped["steps"] < 160
    ckpt = torch.load(run / "checkpoints" / "last.pt", weights_only=True)
    assert ckpt["step"] == stopped["steps"]

    again = vit_train(*command, cwd=tmp_path)  # the same command again
    assert again.returncode == 0, again.stderr
    assert read_results(run)["steps"] == 160
    assert train_losses(run) == train_losses(uninterrupted)  # every step once, the same losses
    final = torch.load(run / "checkpoints" / "last.pt", weights_only=True)
    expected = torch.load(uninterrupted / "checkpoints" / "last.pt", weights_only=True)
    for part in ("model", "optimizer"):
        flat_a, flat_b = torch.utils._pytree.tree_flatten(final[part])[0], torch.utils._pytree.tree_flatten(expected[part])[0]
        assert all(torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b for a, b in zip(flat_a, flat_b))


def test_a_handler_installed_before_gets_the_signal_after_the_stop():
    """E.g. submitit's SIGUSR1 handler, which requeues the job: it runs once the loop has stopped."""
    import os
    import signal

    from vit_train.runtime.preemption import StopRequest

    called = []
    before = signal.signal(signal.SIGUSR1, lambda signum, frame: called.append(signum))
    try:
        with StopRequest() as stop:
            os.kill(os.getpid(), signal.SIGUSR1)
            assert stop and stop.exit_code == 138 and called == []  # ours took it
        assert called == [signal.SIGUSR1]
    finally:
        signal.signal(signal.SIGUSR1, before)


class InjectedFault(RuntimeError):
    """A real failure (out of memory, say) that must surface even after a stop signal."""


@pytest.mark.parametrize("where", ["step", "eval", "save"])
def test_a_real_error_after_a_stop_signal_surfaces(tmp_path, make_config, monkeypatch, where):
    """A signal arrives during step 2; then that step, the eval at step 2 or the save after it fails.
    The stop must not hide the failure: the loader's error handling covers the fetch only."""
    from vit_train import checkpoint
    from vit_train.models.vit import VisionTransformer
    from vit_train.train.trainer import train

    forward, calls = VisionTransformer.forward, []

    def faulty_forward(self, x):
        if self.training:
            calls.append(1)
            if len(calls) == 2:
                os.kill(os.getpid(), signal.SIGUSR1)
                if where == "step":
                    raise InjectedFault("CUDA out of memory")
        elif where == "eval":
            raise InjectedFault("CUDA out of memory")
        return forward(self, x)

    saves = []

    def faulty_save(*args, **kwargs):
        saves.append(1)
        if len(saves) == 1:  # only the save at step 2: the stop's own save would succeed
            raise InjectedFault("the file system failed")

    monkeypatch.setattr(VisionTransformer, "forward", faulty_forward)
    if where == "save":
        monkeypatch.setattr(checkpoint, "save_run_checkpoint", faulty_save)
        monkeypatch.setattr("vit_train.train.trainer.save_run_checkpoint", faulty_save, raising=False)
    cfg = make_config(trainer={"eval_every": 2})
    with pytest.raises(InjectedFault):
        train(cfg, tmp_path / "run")
    assert len(calls) == 2


def test_the_same_stop_signal_again_is_said_once(caplog):
    """A launcher that forwards to its child the signal the whole group got: the child hears it twice."""
    from vit_train.runtime.preemption import StopRequest

    with caplog.at_level("WARNING", logger="vit_train"), StopRequest() as stop:
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.exit_code == 143
    assert [r.getMessage() for r in caplog.records] == [
        "received SIGTERM: checkpointing after this step, then stopping (Ctrl-C again to stop at once)"]


def pin_memory_loop_raising(error: BaseException) -> None:
    """A thread running torch's pin-memory loop over a queue whose workers are gone: `get` raises `error`."""
    import queue
    import threading

    from torch.utils.data._utils import pin_memory

    class Gone:
        def get(self, timeout=None):
            raise error

    thread = threading.Thread(target=pin_memory._pin_memory_loop, args=(Gone(), queue.Queue(), 0, threading.Event(), None))
    thread.start()
    thread.join(10)
    assert not thread.is_alive()


@pytest.fixture
def thread_errors(monkeypatch):
    """The thread errors that reach the hook StopRequest finds installed (Python's prints them). The pin-memory loop
    runs here without an accelerator to select."""
    import threading

    monkeypatch.setattr(torch.accelerator, "set_device_index", lambda index: None)
    shown = []
    monkeypatch.setattr(threading, "excepthook", lambda args: shown.append((args.exc_type, args.thread.name)))
    return shown


@pytest.mark.parametrize("error", [ConnectionResetError(104, "Connection reset by peer"), EOFError(), BrokenPipeError()],
                         ids=["reset", "eof", "pipe"])
def test_after_a_stop_signal_the_pin_memory_threads_error_prints_nothing(thread_errors, error):
    """pytorch #28950: with pinned memory (CUDA) a group SIGTERM ends the loader's workers under its pin-memory
    thread, which dies with a reset connection; before a stop signal the same error is shown (a real fault)."""
    from vit_train.runtime.preemption import StopRequest

    with StopRequest():
        pin_memory_loop_raising(error)
        assert [kind for kind, _ in thread_errors] == [type(error)]
        os.kill(os.getpid(), signal.SIGTERM)
        pin_memory_loop_raising(error)
    assert [kind for kind, _ in thread_errors] == [type(error)]


def test_after_a_stop_signal_another_threads_error_is_still_shown(thread_errors):
    import threading

    from vit_train.runtime.preemption import StopRequest

    def fails():
        raise ConnectionResetError("not the loader's")

    with StopRequest():
        os.kill(os.getpid(), signal.SIGTERM)
        thread = threading.Thread(target=fails, name="other")
        thread.start()
        thread.join()
    assert thread_errors == [(ConnectionResetError, "other")]
