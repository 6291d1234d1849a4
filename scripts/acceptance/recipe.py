"""Part: the flagship recipe as users run it, at batch 128, on a generated CIFAR-format folder.

`vit-train experiment=cifar10_vit_tiny` (ViT-Ti/4, AutoAugment, MixUp/CutMix, repeated augmentation,
erasing, drop path, EMA off) three ways, each for a fixed number of steps: the eager step; the compiled model
(`trainer.compile=true trainer.compile_mode=reduce-overhead`: the model's forward and backward as CUDA graphs,
the optimiser, clipping and schedule eager); the compiled step (`trainer.compile_scope=step` with
reduce-overhead: the whole step as one CUDA graph). For each: training images/s and MFU (median of the logged
windows after the first), the data-wait share, the seconds spent compiling (results.json), and whether
Inductor skipped CUDA graphs (TORCH_LOGS=cudagraphs). The compiled step's logged train losses against the eager
run's (the same seed and draws; bf16: a sanity figure, the CPU tests hold fp32 to 1e-5). Then timm's own
train.py on the same model, data and batch (the closest of its options to the recipe), images/s end to end:
train.py is not in timm's wheel, so its path comes from gpu_acceptance.py --timm-train (environment variable
ACCEPTANCE_TIMM_TRAIN); without it, one note says so.
"""

from __future__ import annotations

import os
import re
import statistics
import sys
from pathlib import Path

from .feeding import cifar_root
from .record import Recorder, read_metrics, read_results, run_command, vit_train

SIZES = {
    "gpu": dict(steps=600, log_every=100, batch=128, timm_seconds=45, model=[]),
    "smoke": dict(steps=6, log_every=2, batch=16, timm_seconds=20,
                  model=["model=vit_micro", "model.depth=2", "trainer.epochs=1"]),
}
WAYS = {  # name: (label, overrides), in the order they run
    "eager": ("eager step", []),
    "step": ("compiled step, reduce-overhead", ["trainer.compile=true", "trainer.compile_scope=step",
                                               "trainer.compile_mode=reduce-overhead"]),
    "model": ("compiled model, reduce-overhead", ["trainer.compile=true", "trainer.compile_mode=reduce-overhead"]),
}
TIMM_RATE = re.compile(r"Train: \d+ \[\s*(\d+)/\d+.*?([\d.]+)/s\s*\(\s*[\d.]+s,\s*([\d.]+)/s\)")


def run_recipe(rec: Recorder) -> None:
    s = SIZES["smoke" if rec.smoke else "gpu"]
    root = cifar_root(rec)
    losses = {}
    for name, (label, overrides) in WAYS.items():
        if rec.left() < (30 if rec.smoke else 60):
            rec.note(f"{label}: not run, {rec.left():.0f} s left")
            continue
        losses[name] = recipe_run(rec, root, s, name, label, overrides)
    if losses.get("eager") and losses.get("step"):
        pairs = [(a, b) for a, b in zip(losses["eager"], losses["step"])]
        rec.figure("step_vs_eager.loss_difference", max(abs(a - b) for a, b in pairs), "", "compiled step against the "
                   f"eager step: largest difference of the {len(pairs)} logged train losses ({'bf16' if rec.cuda else 'fp32'}; "
                   "the same draws)")
    timm_run(rec, root, s)
    eager = rec.data["figures"].get("eager.images_per_s", {}).get("value")
    for name in ("eager", "step", "model"):
        rate, timm = rec.data["figures"].get(f"{name}.images_per_s", {}).get("value"), \
            rec.data["figures"].get("timm.images_per_s", {}).get("value")
        if rate and timm:
            rec.figure(f"{name}.over_timm", rate / timm, "x", f"recipe, {WAYS[name][0]}: vit-train / timm train.py")
        if rate and eager and name != "eager":
            rec.figure(f"{name}.over_eager", rate / eager, "x", f"recipe, {WAYS[name][0]} / the eager step")


def recipe_run(rec: Recorder, root: Path, s: dict, name: str, label: str, overrides: list[str]) -> list[float]:
    """One vit-train run of the recipe for s["steps"] steps: its figures, and its logged train losses."""
    run_dir = rec.work / f"recipe_{name}"
    argv = vit_train("experiment=cifar10_vit_tiny", f"data.root={root}", "data.download=false",
                     f"data.batch_size={s['batch']}", f"trainer.max_steps={s['steps']}",
                     f"trainer.log_every={s['log_every']}", f"trainer.device={rec.device}", "trainer.progress=false",
                     *s["model"], *overrides, f"hydra.run.dir={run_dir}")
    env = {"TORCH_LOGS": "cudagraphs"} if "trainer.compile=true" in overrides else {}
    done = run_command(argv, rec.work, rec.left() - 5, rec.work / "commands.log", env=env)
    results, windows = read_results(run_dir), read_metrics(run_dir, "train")
    timed = [w for w in windows[1:] if w.get("images_per_s")] or [w for w in windows if w.get("images_per_s")]
    said = done.stdout + done.stderr
    fell_back = "could not be compiled" in said or "is compiled instead" in said
    ok = done.returncode == 0 and results.get("status") == "completed" and bool(timed) and not fell_back
    rec.check(f"{name}_run", ok, f"recipe, {label}: completes{' as one compiled graph' if name == 'step' else ''}",
              done.tail() if not ok else f"{results.get('steps')} steps, {results.get('wall_seconds', 0):.0f} s")
    if not timed:
        return []
    rec.figure(f"{name}.images_per_s", statistics.median(w["images_per_s"] for w in timed), "img/s",
               f"recipe at batch {s['batch']}, {label}: training images/s")
    if all("mfu" in w for w in timed):
        rec.figure(f"{name}.mfu", statistics.median(w["mfu"] for w in timed), "share", f"recipe, {label}: MFU")
    rec.figure(f"{name}.data_wait", statistics.mean(w["data_wait"] for w in timed), "share",
               f"recipe, {label}: share of step time waiting for data")
    if results.get("compile_seconds") is not None:
        rec.figure(f"{name}.compile_seconds", results["compile_seconds"], "s",
                   f"recipe, {label}: seconds compiling (step and evaluation; not in images/s)")
    if "trainer.compile=true" in overrides and rec.cuda:
        skips = [line.strip() for line in said.splitlines() if "skipping cudagraphs" in line]
        rec.check(f"{name}_cuda_graphs", not skips, f"recipe, {label}: replays as CUDA graphs",
                  "; ".join(skips[:3]) or "no skip said (TORCH_LOGS=cudagraphs)")
    return [w["loss"] for w in windows if w.get("loss") is not None]


def timm_run(rec: Recorder, root: Path, s: dict) -> None:
    """timm's train.py on the same data, model and batch for s["timm_seconds"], stopped by SIGTERM: its images/s
    (the running average its log lines print, the last one)."""
    train_py = os.environ.get("ACCEPTANCE_TIMM_TRAIN")
    if not train_py or not Path(train_py).is_file():
        rec.note("timm train.py: not run (give gpu_acceptance.py --timm-train PATH/TO/pytorch-image-models/train.py,"
                 " from the tag of the installed timm)" + (f"; {train_py} is not a file" if train_py else ""))
        return
    model = ["--model-kwargs", "img_size=32", "patch_size=4", "depth=2", "embed_dim=64", "num_heads=2"] if rec.smoke else \
        ["--model-kwargs", "img_size=32", "patch_size=4"]
    args = ["--dataset", "torch/cifar10", "--data-dir", str(root), "--model", "vit_tiny_patch16_224", *model,
            "--img-size", "32", "--num-classes", "10", "--mean", "0.4914", "0.4822", "0.4465", "--std", "0.2470",
            "0.2435", "0.2616", "-b", str(s["batch"]), "--opt", "adamw", "--lr", "1e-3", "--weight-decay", "0.05",
            "--sched", "cosine", "--warmup-epochs", "10", "--epochs", "100", "--aa", "original", "--mixup", "0.8",
            "--cutmix", "1.0", "--smoothing", "0.1", "--reprob", "0.25", "--drop-path", "0.1", "--workers",
            str(min(16, os.cpu_count() or 1)), "--pin-mem", "--log-interval", "50", "--output", str(rec.work / "timm"),
            *(["--amp", "--amp-dtype", "bfloat16"] if rec.cuda else ["--device", "cpu"])]
    # torchvision's CIFAR10 checks its files' MD5 sums, which generated images do not have
    code = ("import runpy, sys, torchvision.datasets.cifar as c; c.check_integrity = lambda *a, **k: True; "
            "c.CIFAR10._check_integrity = lambda self: True; "
            f"sys.argv = [{train_py!r}, *sys.argv[1:]]; runpy.run_path({train_py!r}, run_name='__main__')")
    done = run_command([sys.executable, "-c", code, *args], rec.work, min(s["timm_seconds"], rec.left() - 5),
                       rec.work / "commands.log", grace=5)
    rates = [float(m.group(3)) for m in TIMM_RATE.finditer(done.stdout + done.stderr) if int(m.group(1)) > 0]
    rec.check("timm_run", bool(rates), "timm train.py on the recipe's model, data and batch: runs",
              f"{len(rates)} log lines" if rates else done.tail())
    if rates:
        rec.figure("timm.images_per_s", rates[-1], "img/s", f"timm train.py, batch {s['batch']} (AutoAugment "
                   f"'original', MixUp/CutMix, erasing, drop path, {'bf16' if rec.cuda else 'fp32'}, no compile): "
                   f"images/s end to end")
