"""A stop signal to the whole process group (loader workers too, as SLURM's scancel/--signal and a
terminal's Ctrl-C send it) wherever it lands: during an evaluation, the training step an evaluation
follows, a checkpoint write, a loader's start-up or the figure work. Each run stops with the signal's
exit status (143, 130, 138), one line and no traceback, status `interrupted` and a last.pt at the
step it reports; `resume=auto` then leaves every file a user reads as an uninterrupted run leaves it:
metrics.jsonl, TensorBoard scalars, last.pt, best.pt, results.json and train.log's closing line.

From users' reports: workers ended under a validation loop raise "DataLoader worker (pid ...) is
killed by signal: Terminated" or "exited unexpectedly" with a traceback (ultralytics #16400 under
DDP, sming256/OpenTAD #39 during validation); a job that ends that way is not requeued (Lightning
#20542); work done inside the signal handler itself fails intermittently (Lightning #21406, fixed by
a flag the loop reads, as preemption.py does). The signal is sent by the run itself at an exact
point (tests/helpers/group_signal.py patches the function there), so no outcome depends on timing.
"""

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers.configs import TINY
from helpers.files import assert_same_run, read_results
from helpers.runs import vit_train

HELPER = Path(__file__).parents[1] / "helpers" / "group_signal.py"
# 12 steps (3 epochs of 4), evaluated at 4, 8 and 12 on 16 val batches that 2 workers prefetch 8 at a time
ARGS = [*TINY, "data.val_size=256", "data.eval_batch_size=16", "data.num_workers=2", "trainer.epochs=3",
        "trainer.log_every=1"]
EXIT = {"TERM": 143, "INT": 130, "USR1": 138}


def signalled_run(run: Path, where: str, n: int, sig: str = "TERM", *extra: str) -> subprocess.CompletedProcess:
    """vit-train ARGS in its own process group, which gets SIG at the n-th `where` (group_signal.py)."""
    spec = json.dumps({"where": where, "n": n, "signal": sig})
    env_mark = {"GROUP_SIGNAL_MARK": str(run.parent / "loader-starts")}
    import os

    return subprocess.run([sys.executable, str(HELPER), spec, *ARGS, *extra, f"hydra.run.dir={run}"], cwd=run.parent,
                          capture_output=True, text=True, timeout=300, start_new_session=True,
                          env={**os.environ, "PYTHONUNBUFFERED": "1", **env_mark})


def reference_run(where: Path, *extra: str) -> Path:
    done = vit_train(*ARGS, *extra, f"hydra.run.dir={where / 'run'}", cwd=where)
    assert done.returncode == 0, done.stderr
    return where / "run"


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    return reference_run(tmp_path_factory.mktemp("uninterrupted"))


def assert_stopped(run: Path, done: subprocess.CompletedProcess, sig: str) -> int:
    """The stop: its exit status, one line, no traceback, the record and a checkpoint at its step."""
    assert done.returncode == EXIT[sig], done.stderr[-3000:]
    assert "Traceback" not in done.stderr and "exited unexpectedly" not in done.stderr, done.stderr[-3000:]
    last_line = done.stderr.strip().splitlines()[-1]
    assert last_line.startswith(f"vit-train: stopped by SIG{sig} at step ") and last_line.endswith(
        f"continue with: vit-train resume={run}"), last_line
    stopped = read_results(run)
    assert stopped["status"] == "interrupted" and stopped["error"] is None
    ckpt = torch.load(run / "checkpoints" / "last.pt", weights_only=True)
    assert ckpt["step"] == stopped["steps"] == int(last_line.split(" at step ")[1].split(";")[0])
    return stopped["steps"]


def assert_same_files(run: Path, reference: Path) -> None:
    """Every file a user reads, against the uninterrupted run's."""
    assert_same_run(run, reference)  # metrics.jsonl rows once each, TensorBoard scalars, last.pt, completed
    got, want = read_results(run), read_results(reference)
    for key in ("best_step", "best_top1", "final_top1", "steps", "epochs", "status"):
        assert got[key] == want[key], key
    best, best_ref = (torch.load(r / "checkpoints" / "best.pt", weights_only=True) for r in (run, reference))
    assert best["step"] == best_ref["step"] == got["best_step"]
    assert all(torch.equal(best["model"][k], best_ref["model"][k]) for k in best_ref["model"])
    closing = lambda r: (r / "train.log").read_text().strip().splitlines()[-1].split("] ", 1)[1]  # noqa: E731
    strip = lambda line: line.split(" steps")[0]  # noqa: E731  (images/s and seconds differ)
    assert strip(closing(run)) == strip(closing(reference)) and closing(run).startswith("completed: best top-1")


MOMENTS = {  # where, n, signal: the moment; the step the run stops at
    "sigterm-during-eval": ("eval", 1, "TERM", 4),  # the first eval's first batch; workers die with batches in flight
    "sigint-during-eval": ("eval", 1, "INT", 4),  # workers ignore SIGINT: the eval finishes, then the stop
    "sigusr1-during-eval": ("eval", 20, "USR1", 8),  # the second eval (step 8): it finishes, best.pt follows
    "sigterm-in-the-step-before-eval": ("eval_step", 4, "TERM", 4),  # step 4's forward; its eval starts workers anew
    "sigterm-in-the-step-before-a-later-eval": ("eval_step", 8, "TERM", 8),  # the val workers kept from step 4 die
    "sigterm-while-checkpointing": ("save", 2, "TERM", 8),  # the save after step 8's eval (best.pt too)
    "sigterm-at-train-loader-start": ("loader", 1, "TERM", 0),  # before the first step
    "sigterm-at-val-loader-start": ("loader", 2, "TERM", 4),  # the val loader's workers start at the first eval
    "sigterm-at-the-last-eval": ("eval", 33, "TERM", 12),  # step 12's eval: resumed at its last step
}
@pytest.mark.slow  # three runs of the command line each (~20 s); the in-process test below is the fast check
@pytest.mark.parametrize("case", MOMENTS)
def test_a_group_signal_anywhere_stops_with_its_status_and_resume_equals_the_uninterrupted_run(
        tmp_path, uninterrupted, case):
    where, n, sig, step = MOMENTS[case]
    run = tmp_path / "run"
    assert assert_stopped(run, signalled_run(run, where, n, sig), sig) == step
    again = vit_train(*ARGS, f"hydra.run.dir={run}", "resume=auto", cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert_same_files(run, uninterrupted)


@pytest.mark.slow
def test_a_group_signal_while_the_run_is_built_ends_it_at_once_and_changes_nothing(tmp_path, uninterrupted):
    """Before the loop (the data, the model, a teacher, the first figures are built) nothing new can be
    saved: SIGTERM ends the process at once by its default action (a shell and SLURM see 143), with no
    traceback, and the files are those of the attempt before (here, stopped at step 4)."""
    from helpers.files import file_bytes

    run = tmp_path / "run"
    assert assert_stopped(run, signalled_run(run, "eval", 1), "TERM") == 4
    before = file_bytes(run)
    done = signalled_run(run, "build", 1, "TERM", "resume=auto")
    assert done.returncode == -signal.SIGTERM and "Traceback" not in done.stderr, done.stderr[-3000:]
    after = file_bytes(run)
    for name in ("checkpoints/last.pt", "results.json", "metrics.jsonl"):
        assert after[Path(name)] == before[Path(name)], name
    again = vit_train(*ARGS, f"hydra.run.dir={run}", "resume=auto", cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert_same_files(run, uninterrupted)


@pytest.mark.slow
def test_a_group_signal_during_the_figure_work_or_the_ema_eval(tmp_path):
    """The figures drawn after an evaluation (trainer.viz_every), and the EMA's evaluation pass that
    follows the model's: the model's val row must not be kept without its EMA row."""
    extra = ("trainer.viz_every=1", "trainer.ema_decay=0.9")
    reference = reference_run(tmp_path, *extra)
    for name, (where, n) in {"figures": ("figures", 1), "ema": ("eval", 16 + 1)}.items():
        run = tmp_path / name / "run"
        run.parent.mkdir()
        assert assert_stopped(run, signalled_run(run, where, n, "TERM", *extra), "TERM") == 4
        again = vit_train(*ARGS, *extra, f"hydra.run.dir={run}", "resume=auto", cwd=run.parent)
        assert again.returncode == 0, again.stderr[-3000:]
        assert_same_files(run, reference)


@pytest.mark.slow  # three torchrun launches of 2 processes
def test_sigterm_to_a_torchrun_group_during_an_eval_stops_both_processes_at_its_step(tmp_path):
    """torchrun, 2 processes with a loader worker each: rank 0 signals the whole group (torchrun, both
    processes, their workers) during the first evaluation. Both processes drop it and stop at step 4,
    rank 0 writes last.pt; the resumed run evaluates step 4 first and ends as an uninterrupted one."""
    import os

    from helpers.runs import torchrun

    args = [*ARGS, "data.num_workers=1"]
    reference = torchrun(*args, "hydra.run.dir=reference", cwd=tmp_path)
    assert reference.returncode == 0, reference.stdout[-3000:]
    spec = json.dumps({"where": "eval", "n": 1, "signal": "TERM"})
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(HELPER), spec,
               *args, "hydra.run.dir=run"]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300, start_new_session=True,
                          env={**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"})
    output = done.stdout + done.stderr
    stops = [line for line in output.splitlines() if "stopped by SIGTERM at step" in line]
    assert len(stops) == 1 and " at step 4;" in stops[0], output[-4000:]  # rank 0 speaks for the group
    assert "vit_train/" not in output and "exited unexpectedly" not in output, output[-4000:]
    assert "SIGTERM ended the evaluation at step 4 with its loader's workers" in output, output[-4000:]
    run = tmp_path / "run"
    assert read_results(run)["status"] == "interrupted" and read_results(run)["steps"] == 4
    assert torch.load(run / "checkpoints" / "last.pt", weights_only=True)["step"] == 4
    resumed = torchrun(*args, "hydra.run.dir=run", "resume=auto", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stdout[-3000:]
    assert_same_files(run, tmp_path / "reference")


def test_sigterm_to_the_run_and_its_workers_during_an_eval_then_resume_equals_the_uninterrupted_run(
        tmp_path, make_config, monkeypatch):
    """In this process, with 2 loader workers: SIGTERM to the run and to every worker (what a signal
    to the process group reaches) during step 8's evaluation (trainer.eval_every=4), with batches in
    flight. Nothing of that evaluation is logged; last.pt holds step 8 with step 4's evaluation as its
    last; the resumed run evaluates step 8 before step 9, once, and ends as an uninterrupted run does."""
    import multiprocessing
    import os

    from helpers.files import logged, rows
    from vit_train.errors import RunStopped
    from vit_train.models.vit import VisionTransformer
    from vit_train.train.trainer import train

    sections = {"trainer": {"eval_every": 4, "log_every": 1}, "data": {"num_workers": 2, "eval_batch_size": 8}}
    train(make_config(**sections), tmp_path / "reference")
    forward, evals = VisionTransformer.forward, []

    def signalling_forward(self, x):
        if not self.training:
            evals.append(1)
            if len(evals) == 17:  # an evaluation has 16 batches (128 images of 8): step 8's first
                for worker in multiprocessing.active_children():
                    os.kill(worker.pid, signal.SIGTERM)
                os.kill(os.getpid(), signal.SIGTERM)
        return forward(self, x)

    run = tmp_path / "run"
    monkeypatch.setattr(VisionTransformer, "forward", signalling_forward)
    with pytest.raises(RunStopped) as stopped:
        train(make_config(**sections), run)
    assert stopped.value.exit_code == 143 and "stopped by SIGTERM at step 8;" in str(stopped.value)
    assert [r["step"] for r in logged(run, "val")] == [4]
    ckpt = torch.load(run / "checkpoints" / "last.pt", weights_only=True)
    assert ckpt["step"] == 8 and ckpt["last_eval"]["step"] == 4 and ckpt["best_step"] == 4
    assert read_results(run)["status"] == "interrupted" and read_results(run)["steps"] == 8
    assert "SIGTERM ended the evaluation at step 8 with its loader's workers: it is left for the resumed run" in \
        (run / "train.log").read_text()
    said = [line.split("] ", 1)[1] for line in (run / "train.log").read_text().splitlines() if "received SIGTERM" in line]
    assert said == ["received SIGTERM: checkpointing once the evaluation of step 8 ends (or is cut short), then "
                    "stopping (Ctrl-C again to stop at once)"]  # where it landed: not "after this step"
    monkeypatch.undo()

    train(make_config(**sections, resume="auto"), run)
    assert [r["step"] for r in logged(run, "val")] == [4, 8, 12, 16]
    order = [(r["split"], r["step"]) for r in rows(run)]
    assert order.index(("val", 8)) == order.index(("train", 8)) + 1 < order.index(("train", 9))
    assert "evaluating step 8 first: a stop signal came before its evaluation was done" in \
        (run / "train.log").read_text()
    assert_same_files(run, tmp_path / "reference")
