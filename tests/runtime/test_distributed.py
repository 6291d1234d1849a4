"""Several processes: torchrun with gloo on the CPU, 2 processes, against 1 process."""

import os
import shutil
import signal
import subprocess
import time

import pytest
import torch

from helpers.files import logged, model_weights, read_results, tb_events
from helpers.runs import torchrun, vit_train
from helpers.two_processes import TINY, assert_weights_close
from vit_train.data.sampler import EpochSampler
from vit_train.tools.report import evaluate_checkpoint

def test_each_process_takes_its_share_of_the_same_global_batches():
    single = [i for i, _ in EpochSampler(100, seed=1, batch_size=8)][:96]  # whole global batches
    shards = [[i for i, _ in EpochSampler(100, seed=1, batch_size=8, rank=r, world_size=2)] for r in range(2)]
    rebuilt = [i for b in range(12) for r in range(2) for i in shards[r][4 * b:4 * b + 4]]
    assert rebuilt == single
    resumed = EpochSampler(100, seed=1, batch_size=8, rank=1, world_size=2)
    resumed.set_epoch(0, start=16)  # two global batches done
    assert [i for i, _ in resumed] == shards[1][8:]


@pytest.mark.slow  # in the slow suite to keep `pytest` near 5 minutes on 2 cores
def test_two_processes_train_like_one_and_write_one_set_of_files(tmp_path):
    one = vit_train(*TINY, "trainer.epochs=2", f"hydra.run.dir={tmp_path / 'one'}", cwd=tmp_path)
    assert one.returncode == 0, one.stderr
    two = torchrun(*TINY, "trainer.epochs=2", cwd=tmp_path)
    assert two.returncode == 0, two.stdout + two.stderr
    runs = [p for p in (tmp_path / "outputs").glob("*/*") if p.is_dir()]
    assert len(runs) == 1  # one run directory for both processes
    run = runs[0]
    assert len(list((run / "tb").glob("events.out.tfevents.*"))) == 1
    assert two.stdout.count("completed: best top-1") == 1  # rank 0 reports
    ones, twos = logged(tmp_path / "one", "train"), logged(run, "train")
    assert [e["step"] for e in twos] == list(range(1, 17))  # each step logged once
    for a, b in zip(ones, twos):
        assert abs(a["loss"] - b["loss"]) < 1e-5 * a["loss"], (a, b)
    assert_weights_close(tmp_path / "one", run)
    # val accuracy over the whole val set (101 images, split 51 + 50), as one process evaluates it
    results = read_results(run)
    alone = evaluate_checkpoint(run / "checkpoints" / "last.pt", attention_images=0, out_dir=tmp_path / "eval",
                                progress=False)
    assert alone["images"] == 101 and alone["top1"] == results["final_top1"]
    assert alone["loss"] == pytest.approx(results["final_loss"], rel=1e-6)


@pytest.mark.slow  # ~13 s on 2 cores; torchrun
def test_a_two_process_checkpoint_resumes_in_one_process(tmp_path):
    two = torchrun(*TINY, "trainer.epochs=2", "hydra.run.dir=two", cwd=tmp_path)
    assert two.returncode == 0, two.stdout + two.stderr
    copy = tmp_path / "copy"
    shutil.copytree(tmp_path / "two", copy)
    for name in ("last.pt", "step_00000016.pt", "best.pt"):
        (copy / "checkpoints" / name).unlink(missing_ok=True)  # the newest left is step 8, the end of epoch 1
    one = vit_train(f"resume={copy}", cwd=tmp_path)
    assert one.returncode == 0, one.stderr
    assert "resumed from" in one.stdout and "step_00000008.pt" in one.stdout
    original = {e["step"]: e["loss"] for e in logged(tmp_path / "two", "train")}
    for e in logged(copy, "train"):
        assert abs(e["loss"] - original[e["step"]]) < 1e-5 * e["loss"]
    assert_weights_close(tmp_path / "two", copy)


@pytest.mark.slow
def test_a_killed_worker_restarts_the_group_which_resumes_and_finishes_at_the_right_step(tmp_path):
    run = torchrun(*TINY, "trainer.epochs=30", "trainer.ckpt_every=1", cwd=tmp_path, restarts=1, wait=False)
    deadline = time.time() + 120
    while time.time() < deadline and not list((tmp_path / "outputs").glob("*/*/checkpoints/step_*.pt")):
        time.sleep(0.05)
    workers = subprocess.run(["pgrep", "-P", str(run.pid)], capture_output=True, text=True).stdout.split()
    assert len(workers) == 2
    os.kill(int(workers[-1]), signal.SIGKILL)
    output, _ = run.communicate(timeout=300)
    assert run.returncode == 0, output
    runs = [p for p in (tmp_path / "outputs").glob("*/*") if (p / "checkpoints").is_dir()]
    assert len(runs) == 1
    results = read_results(runs[0])
    assert results["status"] == "completed" and results["steps"] == 240
    log = (runs[0] / "train.log").read_text()
    assert "restart 1 of the process group" in output and "resumed from" in log
    assert [e["step"] for e in logged(runs[0], "train")] == list(range(1, 241))  # no step twice, none missing


@pytest.mark.slow  # ~7 s on 2 cores; torchrun
def test_a_global_batch_that_does_not_split_is_refused(tmp_path):
    done = torchrun(*TINY, "data.batch_size=34", cwd=tmp_path)
    assert done.returncode != 0
    assert "data.batch_size (34) must split evenly over 2 processes x trainer.accum_steps (2)" in done.stderr
    assert "vit_train/" not in done.stderr  # one line from each process, no traceback from our code
    assert not (tmp_path / "outputs").exists() or not any((tmp_path / "outputs").rglob(".hydra")), \
        sorted((tmp_path / "outputs").rglob("*"))  # no run directory left (it kept .hydra, .lock, .torchrun_run_id)


@pytest.mark.slow
def test_a_stop_signal_to_one_process_stops_both_at_the_same_step_with_a_checkpoint(tmp_path):
    run = torchrun(*TINY, "trainer.epochs=30", "hydra.run.dir=run", cwd=tmp_path, wait=False)
    deadline = time.time() + 120
    while time.time() < deadline and not list((tmp_path / "run" / "checkpoints").glob("step_*.pt")):
        time.sleep(0.05)
    workers = subprocess.run(["pgrep", "-P", str(run.pid)], capture_output=True, text=True).stdout.split()
    os.kill(int(workers[-1]), signal.SIGUSR1)  # one process only
    output, _ = run.communicate(timeout=300)
    assert run.returncode != 0
    results = read_results(tmp_path / "run")
    saved = torch.load(tmp_path / "run" / "checkpoints" / "last.pt", weights_only=True)
    assert results["status"] == "interrupted" and saved["step"] == results["steps"] < 240
    assert "received SIGUSR1" in output and "another process received SIGUSR1" in output
    resumed = torchrun("hydra.run.dir=run", "resume=auto", *TINY, "trainer.epochs=30", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert read_results(tmp_path / "run")["steps"] == 240


def test_slurm_tasks_get_torchruns_variables(tmp_path, monkeypatch):
    from vit_train.runtime.distributed import from_slurm

    scontrol = tmp_path / "scontrol"
    scontrol.write_text("#!/bin/sh\necho node007\necho node008\n")
    scontrol.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    env = {"SLURM_PROCID": "5", "SLURM_LOCALID": "1", "SLURM_NTASKS": "8", "SLURM_JOB_NODELIST": "node[007-008]",
           "SLURM_JOB_ID": "123456"}
    from_slurm(env)
    assert (env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"]) == ("5", "1", "8")
    assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("node007", str(20000 + 123456 % 20000))
    single = {"SLURM_PROCID": "0", "SLURM_NTASKS": "1"}
    from_slurm(single)
    assert "RANK" not in single  # one task: not distributed
    under_torchrun = {"SLURM_PROCID": "0", "SLURM_NTASKS": "4", "RANK": "3"}
    from_slurm(under_torchrun)
    assert under_torchrun["RANK"] == "3"  # torchrun's variables win


FOLDER = ["data=imagefolder", "model.embed_dim=32", "model.depth=2", "model.num_heads=2", "model.img_size=16",
          "model.patch_size=4", "data.batch_size=8", "data.num_workers=2", "trainer.device=cpu",
          "trainer.progress=false", "trainer.log_every=1", "trainer.epochs=12"]  # 6 steps per epoch, 72 steps


@pytest.mark.slow  # three torchrun launches: ~2 min on 2 shared CPU cores
def test_sigterm_to_the_process_group_stops_both_processes_at_one_step_and_resume_finishes_the_run(
        tmp_path, image_folder):
    """As a cluster ends a job: SIGTERM to torchrun, both training processes and their loader
    workers at once. The workers die mid-fetch; each process stops at the agreed step, rank 0
    writes last.pt, and `resume=auto` then ends exactly where an uninterrupted run ends."""
    args = [*FOLDER, f"data.root={image_folder}"]
    whole = torchrun(*args, "hydra.run.dir=whole", cwd=tmp_path)
    assert whole.returncode == 0, whole.stdout

    run = tmp_path / "run"
    proc = torchrun(*args, "hydra.run.dir=run", "resume=auto", cwd=tmp_path, wait=False, start_new_session=True)
    deadline = time.time() + 120
    while time.time() < deadline and not (run / "metrics.jsonl").exists() or len(logged(run, "train")) < 8:
        assert proc.poll() is None and time.time() < deadline, proc.communicate()[0]
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGTERM)
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode != 0 and "vit_train/" not in output, output  # torchrun itself prints its SignalException
    stops = [int(line.split(" at step ")[1].split(";")[0]) for line in output.splitlines() if "stopped by SIGTERM" in line]
    assert len(stops) == 1, output  # rank 0 speaks for the group (rank 1 stopped at that step too: last.pt below)
    assert f"continue with: torchrun <the same options> -m vit_train resume={run}" in output, output
    results = read_results(run)
    saved = torch.load(run / "checkpoints" / "last.pt", weights_only=True)
    assert results["status"] == "interrupted" and saved["step"] == results["steps"] == stops[0] < 72

    resumed = torchrun(*args, "hydra.run.dir=run", "resume=auto", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stdout
    assert [(e["step"], e["loss"]) for e in logged(run, "train")] == [(e["step"], e["loss"])
                                                                      for e in logged(tmp_path / "whole", "train")]
    expected = model_weights(tmp_path / "whole")
    assert all(torch.equal(model_weights(run)[k], v) for k, v in expected.items())


@pytest.mark.slow
def test_figures_with_two_processes_sum_the_confusion_matrix_on_every_process(tmp_path):
    """trainer.viz_every with 2 processes: every process takes part in the confusion matrix's sum (only rank 0
    draws the figures); with rank 0 alone asking, the sum was a collective the other process never joined."""
    pytest.importorskip("matplotlib")
    done = torchrun(*TINY, "trainer.epochs=1", "trainer.viz_every=1", "hydra.run.dir=run", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert read_results(tmp_path / "run")["status"] == "completed"
    assert any("confusion" in tag for tag in tb_events(tmp_path / "run").Tags()["images"])



@pytest.mark.parametrize("rank, contents, kept", [
    ("0", [".hydra/config.yaml", ".lock"], False),  # rank 0: only Hydra's record and the lock -> removed
    ("0", [".hydra/config.yaml", ".lock", ".torchrun_run_id"], False),  # refused after the process group formed
    ("0", [".hydra/config.yaml", "train.log"], True),  # a run wrote into it: kept
    ("0", None, False),  # gone already (another process): no error
    ("1", [], False),  # another rank: an empty directory its Hydra made again after rank 0 removed it
    ("1", [".hydra/config.yaml"], True),  # rank 0's record still in it: rank 0 removes it, not this rank
    ("1", None, False),
])
def test_a_refused_run_directory_is_removed_by_rank_0_and_by_others_only_when_empty(tmp_path, monkeypatch, rank,
                                                                                     contents, kept):
    """Under torchrun every process refuses a bad config at once; each removing the directory raced Hydra's
    writes in another (OSError tracebacks, 2 of 3 tries with 3 processes)."""
    from vit_train.cli.torchrun import remove_unused

    run_dir = tmp_path / "run"
    for name in contents or []:
        (run_dir / name).parent.mkdir(parents=True, exist_ok=True)
        (run_dir / name).write_text("x")
    if contents is not None:
        run_dir.mkdir(exist_ok=True)
    monkeypatch.setenv("RANK", rank)
    remove_unused(run_dir)
    assert run_dir.exists() == kept
