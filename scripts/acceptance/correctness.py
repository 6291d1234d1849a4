"""Part 1, correctness on the device: real vit-train runs on `shapes` with trainer.precision=auto,
the on-device pipeline and (on a GPU) fused AdamW.

- run A: a NaN batch injected at batch `nan` is skipped and counted (on a GPU: by the fused
  AdamW kernel on the device), and the run completes;
- run B: the same run, stopped by SIGTERM at batch `stop`, then `resume=auto`: compared with A
  (bit-exact or the largest difference; if not exact, a second uninterrupted run says whether
  two uninterrupted runs differ as much);
- vit-eval on A's last checkpoint reproduces A's final top-1;
- `torchrun --nproc_per_node=1 -m vit_train` completes, and a torchrun DDP step with NCCL (gloo
  on the CPU) runs; with one process vit-train itself needs no process group;
- on a GPU, a run with trainer.compile=true completes.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import torch

from .record import (CHILD, Recorder, read_metrics, read_results, run_command, torchrun, vit_eval, vit_train,
                     vit_train_injected)

SIZES = {  # shapes run: steps per epoch = train // batch
    "gpu": dict(model=["model=vit_tiny"], train=4096, val=1024, batch=256, epochs=3, nan=5, stop=20, run_s=120),
    "smoke": dict(model=["model.embed_dim=32", "model.depth=2", "model.num_heads=2", "model.img_size=16"],
                  train=256, val=128, batch=32, epochs=2, nan=3, stop=10, run_s=400),
}
COMPILE_S = 60  # the compiled run: start-up, Inductor compiling the training and eval graphs, one epoch


def run_correctness(rec: Recorder) -> None:
    s = SIZES["smoke" if rec.smoke else "gpu"]
    steps = s["train"] // s["batch"] * s["epochs"]
    base = ["data=shapes", *s["model"], f"data.train_size={s['train']}", f"data.val_size={s['val']}",
            f"data.batch_size={s['batch']}", f"trainer.epochs={s['epochs']}", f"trainer.device={rec.device}",
            "trainer.precision=auto", "data.pipeline=device", "trainer.log_every=1", "trainer.progress=false"]
    log = rec.work / "commands.log"

    def run(name: str, argv: list[str]) -> tuple:
        done = run_command(argv, rec.work, min(s["run_s"], rec.left()), log)
        rec.figure(f"{name}.seconds", done.seconds, "s", f"seconds: {name} command (start-up included)")
        return done

    a_dir, b_dir = rec.work / "run_a", rec.work / "run_b"
    a = run("run_a", vit_train_injected(s["nan"], None, *base, f"hydra.run.dir={a_dir}"))
    a_ok = check_nan_run(rec, a, a_dir, steps)
    check_stop_resume(rec, run, base, a_dir, b_dir, s, steps)
    if a_ok:
        check_eval(rec, run, a_dir, s["val"])
    t_dir = rec.work / "torchrun"
    done = run("torchrun", torchrun("-m", "vit_train", *base, "trainer.epochs=1", f"hydra.run.dir={t_dir}"))
    results = read_results(t_dir)
    rec.check("torchrun", done.returncode == 0 and results.get("status") == "completed",
              "torchrun --nproc_per_node=1 -m vit_train completes", done.tail() if done.returncode else
              f"{results.get('steps')} steps, top-1 {results.get('final_top1')}")
    done = run("ddp", torchrun(str(CHILD), "ddp", *(["--cpu"] if not rec.cuda else [])))
    report = last_json(done.stdout)
    backend = "nccl" if rec.cuda else "gloo"
    rec.check("ddp", done.returncode == 0 and report.get("backend") == backend and bool(report.get("grads_finite")),
              f"torchrun DDP training step with {backend.upper()}", json.dumps(report) if report else done.tail())
    if rec.cuda and rec.left() < COMPILE_S:
        rec.note(f"trainer.compile=true through vit-train: not run, {rec.left():.0f} s left (needs ~{COMPILE_S} s)")
    elif rec.cuda:
        c_dir = rec.work / "compiled"
        done = run("compiled", vit_train(*base, "trainer.compile=true", "trainer.epochs=1", f"hydra.run.dir={c_dir}"))
        results = read_results(c_dir)
        rec.check("compiled", done.returncode == 0 and results.get("status") == "completed"
                  and results.get("final_top1") is not None, "vit-train with trainer.compile=true completes",
                  done.tail() if done.returncode else f"top-1 {results.get('final_top1')}")
    else:
        rec.note("trainer.compile=true through vit-train: on a GPU only (an Inductor CPU build takes minutes)")


def check_nan_run(rec: Recorder, done, run_dir: Path, steps: int) -> bool:
    """Run A: completed, the NaN batch skipped and counted once, bf16/device pipeline/fused on a GPU."""
    results = read_results(run_dir)
    ok = rec.check("run_a", done.returncode == 0 and results.get("status") == "completed"
                   and results.get("steps") == steps, f"vit-train on shapes completes ({steps} steps)",
                   done.tail() if done.returncode else f"{results.get('steps')} steps, "
                   f"final top-1 {results.get('final_top1')}, {results.get('images_per_s') or 0:.0f} images/s")
    if not ok:
        return False
    text = done.stdout + done.stderr + (run_dir / "train.log").read_text()  # some lines come before train.log opens
    precision = re.search(r"precision (torch\.\w+)", text)
    want = "torch.bfloat16" if rec.cuda else "torch.float32"
    rec.check("precision", precision is not None and precision.group(1) == want,
              f"trainer.precision=auto runs in {want.split('.')[1]}", precision.group(0) if precision else "not logged")
    pipeline = re.search(r"data pipeline: on (\S+)", text)
    rec.check("device_pipeline", pipeline is not None and pipeline.group(1).startswith(rec.device),
              f"the on-device pipeline runs on {rec.device}", pipeline.group(0) if pipeline else "not logged")
    ckpt = torch.load(run_dir / "checkpoints" / "last.pt", map_location="cpu", weights_only=True)
    fused = bool(ckpt["optimizer"]["param_groups"][0].get("fused"))
    rec.check("fused_adamw", fused == rec.cuda, f"AdamW {'fused' if rec.cuda else 'not fused (CPU)'}",
              f"param_groups fused={fused}")
    weights_finite = all(bool(torch.isfinite(v).all()) for v in ckpt["model"].values() if v.is_floating_point())
    where = "on the device (fused AdamW's found_inf)" if fused else "by the host check"
    rec.check("nan_skipped", results.get("skipped_steps") == 1 and weights_finite,
              f"the injected NaN batch is skipped and counted {where}",
              f"skipped_steps={results.get('skipped_steps')}, weights finite: {weights_finite}")
    rec.figure("run_a.final_top1", results.get("final_top1"), "%", "run A: final val top-1 on shapes")
    return True


def check_stop_resume(rec: Recorder, run, base: list[str], a_dir: Path, b_dir: Path, s: dict, steps: int) -> None:
    """Run B: SIGTERM at batch `stop` (with the same NaN batch), then resume=auto; compared with A."""
    stopped = run("run_b_stop", vit_train_injected(s["nan"], s["stop"], *base, f"hydra.run.dir={b_dir}"))
    first = read_results(b_dir)
    # The batch being fetched when the signal came is trained on or not, as the loop decides.
    if not rec.check("stop", stopped.returncode == 143 and first.get("status") == "interrupted"
                     and s["stop"] <= (first.get("steps") or 0) <= s["stop"] + 1,
                     "SIGTERM mid-epoch: checkpoint and exit 143",
                     f"exit {stopped.returncode}, status {first.get('status')}, at step {first.get('steps')}"):
        return
    resumed = run("run_b_resume", vit_train(*base, f"hydra.run.dir={b_dir}", "resume=auto"))
    results = read_results(b_dir)
    if not rec.check("resume", resumed.returncode == 0 and results.get("status") == "completed"
                     and results.get("steps") == steps and results.get("skipped_steps") == 1,
                     "resume=auto continues to the last step (the skip still counted)",
                     resumed.tail() if resumed.returncode else f"{results.get('steps')} steps, "
                     f"skipped_steps={results.get('skipped_steps')}"):
        return
    if not (a_dir / "checkpoints" / "last.pt").exists():
        return
    diff = max_difference(a_dir, b_dir)
    losses_a, losses_b = train_losses(a_dir), train_losses(b_dir)
    same_losses = sum(losses_a.get(k) == v for k, v in losses_b.items())
    rec.figure("resume.max_abs_diff", diff, "", "stopped + resumed vs uninterrupted: largest weight/optimiser difference")
    rec.figure("resume.equal_losses", same_losses, "steps", "stopped + resumed vs uninterrupted: equal step losses",
               detail=f"of {len(losses_a)} logged")
    detail = f"max abs difference {diff:.3g}, {same_losses}/{len(losses_a)} step losses equal"
    if diff == 0:
        rec.check("resume_exact", True, "resumed run bit-exact with the uninterrupted run", detail)
        return
    again = rec.work / "run_a2"  # is it resume, or do two uninterrupted runs differ too?
    run("run_a2", vit_train_injected(s["nan"], None, *base, f"hydra.run.dir={again}"))
    baseline = max_difference(a_dir, again) if (again / "checkpoints" / "last.pt").exists() else math.nan
    rec.figure("resume.baseline_max_abs_diff", baseline, "", "two uninterrupted runs: largest difference")
    rec.check("resume_exact", baseline > 0, "resumed run bit-exact, or two uninterrupted runs differ too "
              "(non-deterministic kernels)", f"{detail}; two uninterrupted runs: {baseline:.3g}")


def check_eval(rec: Recorder, run, run_dir: Path, val_size: int) -> None:
    done = run("vit_eval", vit_eval(f"ckpt={run_dir / 'checkpoints' / 'last.pt'}", "weights=model",
                                    "attention.images=0", "progress=false", f"out={run_dir / 'eval'}", "--json"))
    got = last_json(done.stdout, whole=True).get("top1")
    want = read_results(run_dir).get("final_top1")
    close = got is not None and want is not None and abs(got - want) < 50 / val_size  # under half an image
    rec.check("vit_eval", done.returncode == 0 and close, "vit-eval reproduces the run's final top-1",
              f"vit-eval {got}, run {want}" if done.returncode == 0 else done.tail())


def max_difference(a: Path, b: Path) -> float:
    """Largest absolute difference between two runs' last.pt model and optimiser tensors."""
    x = torch.load(a / "checkpoints" / "last.pt", map_location="cpu", weights_only=True)
    y = torch.load(b / "checkpoints" / "last.pt", map_location="cpu", weights_only=True)
    largest = 0.0
    for part in ("model", "optimizer"):
        left, right = torch.utils._pytree.tree_leaves(x[part]), torch.utils._pytree.tree_leaves(y[part])
        if len(left) != len(right):
            return math.inf
        for p, q in zip(left, right):
            if isinstance(p, torch.Tensor) and p.is_floating_point():
                largest = max(largest, float((p.double() - q.double()).abs().max()) if p.numel() else 0.0)
            elif isinstance(p, torch.Tensor) and not torch.equal(p, q) or not isinstance(p, torch.Tensor) and p != q:
                return math.inf
    return largest


def train_losses(run_dir: Path) -> dict[int, float]:
    return {e["step"]: e["loss"] for e in read_metrics(run_dir, "train")}


def last_json(text: str, whole: bool = False) -> dict:
    """The JSON object a command printed: its whole stdout (`whole`) or its last line."""
    try:
        return json.loads(text if whole else text.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {}
