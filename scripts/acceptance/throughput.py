"""Part 2, throughput: bf16 training images/s and MFU of this project's ViT and timm's
VisionTransformer of the same shape and weights, in one process, on synthetic data on the device,
eager and compiled (torch.compile default mode, then max-autotune while time is left).

The measurement is scripts/benchmark.py's (`compare`: full training steps with fused AdamW,
interleaved rounds, medians); FLOPs per image are vit_train.train.throughput's, the peak its table's.
"""

from __future__ import annotations

import gc
import sys
import time
from pathlib import Path

import torch
from vit_train.train.throughput import flops_per_image, peak_tflops

from .record import Recorder

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/: benchmark.py
import benchmark  # noqa: E402

# name: (configs/model file, image side, patch side, batch, classes, label)
SHAPES = {
    "gpu": {"vit_ti4_32": ("vit_tiny", 32, 4, 1024, 10, "ViT-Ti/4 @32, batch 1024"),
            "vit_s16_224": ("vit_small", 224, 16, 256, 1000, "ViT-S/16 @224, batch 256"),
            "vit_b16_224": ("vit_base", 224, 16, 256, 1000, "ViT-B/16 @224, batch 256")},
    "smoke": {"micro4_16": ("vit_micro", 16, 4, 8, 10, "ViT-micro/4 @16, batch 8 (smoke)")},
}
# Seconds a measurement is expected to take (compilation included); one that does not fit in the
# time left is skipped and noted. The smoke run compiles with backend="eager" (no Inductor build).
COST = {"gpu": {"eager": 12, "default": 60, "max-autotune": 180}, "smoke": {"eager": 30, "default": 60}}
ROUNDS = {"gpu": (3, 10), "smoke": (2, 1)}  # (rounds, timed steps per round and model)


def run_throughput(rec: Recorder) -> None:
    kind = "smoke" if rec.smoke else "gpu"
    device = torch.device(rec.device)
    if rec.cuda:
        torch.backends.cuda.matmul.allow_tf32 = True
    peak = peak_tflops(device, torch.bfloat16, None)
    rec.set("peak_tflops", peak)
    best: dict[str, float] = {}
    cost = dict(COST[kind])  # raised to what the last measurement of a mode took (bigger shapes come later)
    for mode in cost:
        for key, shape in SHAPES[kind].items():
            if rec.left() < cost[mode]:
                rec.note(f"{shape[5]}, {mode}: not measured, {rec.left():.0f} s left (needs ~{cost[mode]:.0f} s)")
                continue
            start = time.time()
            try:
                result = measure(shape, mode, device, peak, rec.smoke, ROUNDS[kind])
            except Exception as e:  # noqa: BLE001 - e.g. out of memory or a compiler error: recorded, go on
                rec.check(f"{key}.{mode}", False, f"{shape[5]}, {mode}: measured", f"{type(e).__name__}: {e}"[:500])
                continue
            finally:
                release()
            took = time.time() - start
            cost[mode] = max(cost[mode], 1.2 * took)
            rec.check(f"{key}.{mode}", True, f"{shape[5]}, {mode}: measured", f"{took:.0f} s")
            record(rec, key, mode, shape[5], result)
            best[key] = max(best.get(key, 0.0), result["vit_train_images_per_s"])
            rec.figure(f"{key}.best_images_per_s", best[key], "img/s", f"{shape[5]}: vit-train, best mode")


def measure(shape: tuple, mode: str, device: torch.device, peak: float | None, smoke: bool, rounds: tuple) -> dict:
    name, img, patch, batch_size, classes, _ = shape
    cfg = benchmark.model_config(name, img, patch)
    torch.manual_seed(0)
    ours = cfg.build(classes).to(device)
    models = {"vit_train": ours, "timm": benchmark.timm_twin(ours, cfg, classes).to(device)}
    if mode != "eager":
        options = dict(backend="eager") if smoke else dict(mode=None if mode == "default" else mode)
        models = {n: torch.compile(m, **options) for n, m in models.items()}
    batch = (torch.randn(batch_size, 3, img, img, device=device), torch.randint(0, classes, (batch_size,), device=device))
    return benchmark.compare(models, batch, rounds[0], rounds[1], torch.bfloat16, device,
                             flops_per_image(cfg, classes), peak)


def record(rec: Recorder, key: str, mode: str, label: str, r: dict) -> None:
    """Per model images/s and MFU (JSON), and one table row: the ratio, with both models' figures."""
    where, text = f"{label}, {mode}", []
    for model in ("vit_train", "timm"):
        name = "vit-train" if model == "vit_train" else "timm"
        rate, mfu = r[f"{model}_images_per_s"], r[f"{model}_mfu"]
        rec.figure(f"{key}.{mode}.{model}_images_per_s", rate, "img/s", f"{where}: {name}", table=False)
        rec.figure(f"{key}.{mode}.{model}_mfu", mfu, "", f"{where}: {name} MFU", table=False)
        text.append(f"{name} {rate:,.0f} img/s" + (f" (MFU {100 * mfu:.1f}%)" if mfu is not None else ""))
    rec.figure(f"{key}.{mode}.ratio", r["ratio"], "x", f"{where}: vit-train / timm", detail=", ".join(text))


def release() -> None:
    """Free the models and compiled graphs before the next shape."""
    torch._dynamo.reset()
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
