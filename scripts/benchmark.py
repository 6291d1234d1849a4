"""Training throughput of this project's ViT against timm's VisionTransformer, in one process, and
the data pipelines' throughput on their own, and (--mae-ratio) masked-autoencoder pre-training of the same
encoder against its classification training.

Both models get the same shape and the same weights; each round times a few full training steps
(forward, backward, AdamW step) of each, interleaved, so machine noise hits both alike. Reports
images/s per model and precision, the ratio ours / timm (median over rounds), achieved TFLOP/s and,
where the peak is known (a GPU in vit_train.train.throughput.PEAKS, or --peak-tflops), MFU. Then the small-image
pipelines alone (crop + flip + normalise of uint8 images): the on-device pipeline and the CPU
DataLoader, in images/s. MAE: images/s of a pre-training step (encoder on the visible patches, the
default mae.* decoder) over images/s of a classification step, median over rounds (He et al. 2022
report ~3x at mask ratio 0.75 for ViT-L).

    python scripts/benchmark.py                                  # vit_tiny, 32x32, patch 4, batch 128
    python scripts/benchmark.py --model vit_small --img-size 224 --patch-size 16 --batch-size 64
    python scripts/benchmark.py --precision fp32,bf16 --rounds 5 --json
    python scripts/benchmark.py --distill resnet18 --options    # + distillation step cost, options' cost

--distill ARCH times a DeiT distillation step (teacher forward without gradients, two-head loss) of a
distilled student against a plain classification step of the same student, interleaved: the ratio is
the distillation step's time over the plain step's. --options times the ViT with every option of
docs/vit-options.md off against the same ViT with them on, and reports ours / timm with the options
off (the cost of the code paths when off).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import statistics
import time
from pathlib import Path

import torch
from omegaconf import OmegaConf

from vit_train.config import Config
from vit_train.data.aug.basic import Basic
from vit_train.models.families.vit import ViT
from vit_train.data.device.pipeline import DeviceTrainPipeline
from vit_train.data.datasets import TensorImages, TransformedDataset
from vit_train.data.sampler import EpochSampler
from vit_train.data.transforms import build_transforms
from vit_train.runtime.device import autocast_dtype
from vit_train.models.mae import build_autoencoder
from vit_train.objectives.mae import MaskedReconstruction
from vit_train.train.throughput import flops_per_image, peak_tflops

CONFIGS = Path(__file__).resolve().parents[1] / "configs" / "model"


def timm_twin(model: torch.nn.Module, cfg: ViT, num_classes: int) -> torch.nn.Module:
    from timm.models.vision_transformer import VisionTransformer

    pool = dict(global_pool="token") if cfg.pool == "cls" else dict(global_pool="avg", class_token=False, fc_norm=False)
    twin = VisionTransformer(img_size=cfg.img_size, patch_size=cfg.patch_size, num_classes=num_classes,
                             embed_dim=cfg.embed_dim, depth=cfg.depth, num_heads=cfg.num_heads,
                             mlp_ratio=cfg.mlp_ratio, qkv_bias=cfg.qkv_bias, **pool)
    twin.load_state_dict(model.state_dict())
    return twin


def images_per_second(model: torch.nn.Module, batch: tuple, steps: int, dtype: torch.dtype | None,
                      device: torch.device, objective=None) -> float:
    """Training steps per second x batch; `objective` (model, images, targets) -> (loss, _) replaces cross-entropy."""
    loss_fn = cross_entropy if objective is None else lambda m, x, y: objective(m, x, y)[0]
    step = training_step(model, loss_fn, batch, dtype, device)
    return len(batch[0]) / interleaved({"step": step}, 1, steps, device)["step"]


def cross_entropy(model: torch.nn.Module, images: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(model(images), targets)


def interleaved(steps: dict, rounds: int, repeat: int, device: torch.device) -> dict[str, float]:
    """Median seconds per call of each step function, timed in turns so that noise hits all alike."""
    times = {name: [] for name in steps}
    for fn in steps.values():
        fn()  # warm-up: allocations, kernel selection, compilation
    for _ in range(rounds):
        for name, fn in steps.items():
            if device.type == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(repeat):
                fn()
            if device.type == "cuda":
                torch.cuda.synchronize()
            times[name].append((time.perf_counter() - start) / repeat)
    return {name: statistics.median(t) for name, t in times.items()}


def training_step(model: torch.nn.Module, loss_fn, batch: tuple, dtype: torch.dtype | None, device: torch.device):
    """A function doing one training step (forward, `loss_fn`, backward, AdamW step) on `batch`."""
    images, targets = batch
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4,
                                  fused=device.type == "cuda")

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
            loss = loss_fn(model, images, targets)
        loss.backward()
        optimizer.step()
    return step


def distill_cost(cfg: ViT, teacher_arch: str, num_classes: int, batch: tuple, dtype, device, args) -> dict:
    """Seconds per training step of a distilled student with and without its teacher's forward."""
    from vit_train.models.families.resnet import build_resnet
    from vit_train.objectives.distill import Distill
    from vit_train.objectives.teacher import DistillationLoss

    student = ViT(**{**cfg.__dict__, "distilled": True}).build(num_classes).to(device)
    teacher = build_resnet(teacher_arch, num_classes, cfg.img_size).to(device).eval().requires_grad_(False)
    objective = DistillationLoss(teacher, Distill(), 0.0, two_heads=True, info={})
    plain = training_step(student, cross_entropy, batch, dtype, device)
    distill = training_step(student, lambda m, x, y: objective(m, x, y)[0], batch, dtype, device)
    seconds = interleaved({"plain": plain, "distill": distill}, args.rounds, args.steps, device)
    return {"teacher": teacher_arch, "plain_step_s": seconds["plain"], "distill_step_s": seconds["distill"],
            "ratio": seconds["distill"] / seconds["plain"]}


def options_cost(cfg: ViT, num_classes: int, batch: tuple, dtype, device, args) -> dict:
    """Seconds per training step: the ViT with the options off, on, and timm's twin with them off."""
    ce = cross_entropy
    off = cfg.build(num_classes).to(device)
    on = ViT(**{**cfg.__dict__, "reg_tokens": 4, "init_values": 1e-5, "qk_norm": True}).build(num_classes).to(device)
    steps = {"off": training_step(off, ce, batch, dtype, device), "on": training_step(on, ce, batch, dtype, device),
             "timm_off": training_step(timm_twin(off, cfg, num_classes).to(device), ce, batch, dtype, device)}
    seconds = interleaved(steps, args.rounds, args.steps, device)
    return {**{f"{k}_step_s": v for k, v in seconds.items()}, "on_over_off": seconds["on"] / seconds["off"],
            "off_over_timm": seconds["off"] / seconds["timm_off"]}


def model_config(name: str, img_size: int, patch_size: int) -> ViT:
    """The size preset configs/model/<name>.yaml at this image and patch size."""
    preset = {k: v for k, v in OmegaConf.to_container(OmegaConf.load(CONFIGS / f"{name}.yaml")).items() if k != "defaults"}
    return ViT(**{**preset, "img_size": img_size, "patch_size": patch_size})


def compare(models: dict[str, torch.nn.Module], batch: tuple, rounds: int, steps: int, dtype: torch.dtype | None,
            device: torch.device, flops: float, peak: float | None, mae: tuple | None = None) -> dict:
    """Training images/s of each model ("vit_train" and "timm"), interleaved over `rounds` rounds of
    `steps` steps: per model the median images/s, TFLOP/s (at `flops` per image) and MFU (None
    without a known `peak`, TFLOP/s), and the ratio vit_train / timm (median of the rounds' ratios).
    `mae` = (model, objective): its pre-training images/s too, over vit_train's (mae_over_classify)."""
    timings = {name: [] for name in models}
    for _ in range(rounds):
        for name, model in models.items():
            timings[name].append(images_per_second(model, batch, steps, dtype, device))
        if mae:
            timings.setdefault("mae", []).append(images_per_second(mae[0], batch, steps, dtype, device, mae[1]))
    ratios = [a / b for a, b in zip(timings["vit_train"], timings["timm"])]
    result = {**{f"{n}_images_per_s": statistics.median(r) for n, r in timings.items()},
              "ratio": statistics.median(ratios), "ratios": ratios}
    if mae:
        mae_ratios = [a / b for a, b in zip(timings["mae"], timings["vit_train"])]
        result.update(mae_over_classify=statistics.median(mae_ratios), mae_ratios=mae_ratios)
    for name in models:
        tflops = result[f"{name}_images_per_s"] * flops / 1e12
        result[f"{name}_tflops"] = tflops
        result[f"{name}_mfu"] = tflops / peak if peak else None
    return result


def pipeline_images_per_second(kind: str, count: int, img_size: int, batch_size: int, device: torch.device,
                               workers: int) -> float:
    """One epoch of `count` random uint8 32x32 images through aug=basic, batches of `batch_size`."""
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (count, 3, 32, 32), dtype=torch.uint8, generator=g)
    labels = torch.randint(0, 10, (count,), generator=g)
    stats = ((0.5,) * 3, (0.25,) * 3)
    sampler = EpochSampler(count, seed=0, batch_size=batch_size)
    if kind == "device":
        batches = DeviceTrainPipeline(images, labels, sampler, Basic(), img_size, stats, device)
    else:
        train_tf, _ = build_transforms(Basic(), img_size, stats, 32)
        batches = torch.utils.data.DataLoader(TransformedDataset(TensorImages(images, labels), train_tf),
                                              batch_size=batch_size, sampler=sampler, drop_last=True,
                                              num_workers=workers, pin_memory=device.type == "cuda")
    seen = 0
    start = time.perf_counter()
    for x, *_ in batches:  # the loader also gives unreadable-image indices
        x = x.to(device, non_blocking=True)
        seen += len(x)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return seen / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="vit_tiny", help="a file name in configs/model/")
    parser.add_argument("--img-size", type=int, default=32)
    parser.add_argument("--patch-size", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--num-classes", type=int, default=10)
    parser.add_argument("--precision", default="fp32,bf16", help="comma-separated: fp32, bf16, fp16")
    parser.add_argument("--steps", type=int, default=3, help="timed training steps per model per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--compile", action="store_true", help="also torch.compile both models")
    parser.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"])
    parser.add_argument("--peak-tflops", type=float, default=None, help="peak for MFU where the table has none")
    parser.add_argument("--pipeline-images", type=int, default=8192, help="images per pipeline measurement; 0 = skip")
    parser.add_argument("--workers", type=int, default=0, help="DataLoader workers for the loader pipeline")
    parser.add_argument("--mae-ratio", type=float, default=0.75, help="MAE pre-training at this mask ratio; 0 = skip")
    parser.add_argument("--distill", default=None, metavar="ARCH", help="also time a distillation step with this "
                        "torchvision ResNet teacher (resnet18, resnet50) against a plain step")
    parser.add_argument("--options", action="store_true", help="also time the ViT options off, on, and timm's twin")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    args = parser.parse_args()

    device = torch.device("cuda" if args.device != "cpu" and torch.cuda.is_available() else "cpu")
    cfg = model_config(args.model, args.img_size, args.patch_size)
    torch.manual_seed(0)
    flops = flops_per_image(cfg, args.num_classes)
    ours = cfg.build(args.num_classes).to(device)
    models = {"vit_train": ours, "timm": timm_twin(ours, cfg, args.num_classes).to(device)}
    mae = None
    if args.mae_ratio:
        mae_cfg = Config.from_dict({"model": dataclasses.asdict(cfg), "objective": {"name": "mae",
                                                                                     "mask_ratio": args.mae_ratio}})
        mae = (build_autoencoder(mae_cfg.model, mae_cfg.objective).to(device), MaskedReconstruction(mae_cfg))
        mae[0].encoder.load_state_dict({k: v for k, v in ours.state_dict().items() if not k.startswith("head.")})
    if args.compile:
        models = {name: torch.compile(m) for name, m in models.items()}
        mae = (torch.compile(mae[0]), mae[1]) if mae else None
    batch = (torch.randn(args.batch_size, 3, args.img_size, args.img_size, device=device),
             torch.randint(0, args.num_classes, (args.batch_size,), device=device))

    results = []
    for precision in args.precision.split(","):
        dtype = autocast_dtype(precision, device)
        peak = peak_tflops(device, dtype, args.peak_tflops)
        results.append({"precision": precision, **compare(models, batch, args.rounds, args.steps, dtype, device,
                                                          flops, peak, mae)})

    pipelines = {}
    if args.pipeline_images:
        for kind in ("device", "loader"):
            pipelines[f"{kind}_images_per_s"] = pipeline_images_per_second(
                kind, args.pipeline_images, args.img_size, args.batch_size, device, args.workers)
        training = max(r["vit_train_images_per_s"] for r in results)
        pipelines["device_over_training"] = pipelines["device_images_per_s"] / training

    extras = {}
    first = autocast_dtype(args.precision.split(",")[0], device)
    if args.distill:
        extras["distill"] = distill_cost(cfg, args.distill, args.num_classes, batch, first, device, args)
    if args.options:
        extras["options"] = options_cost(cfg, args.num_classes, batch, first, device, args)

    setting = {"model": args.model, "img_size": args.img_size, "patch_size": args.patch_size,
               "batch_size": args.batch_size, "device": str(device), "compile": args.compile,
               "threads": torch.get_num_threads(), "torch": str(torch.__version__), "machine": platform.machine(),
               "gpu": torch.cuda.get_device_name() if device.type == "cuda" else None,
               "training_gflop_per_image": flops / 1e9, "mae_ratio": args.mae_ratio or None}
    if args.json:
        print(json.dumps({"setting": setting, "results": results, "pipelines": pipelines, **extras}, indent=2))
        return
    print(", ".join(f"{k}={v}" for k, v in setting.items()))
    print(f"{'precision':<10}{'vit_train img/s':>16}{'timm img/s':>12}{'ratio':>8}{'TFLOP/s':>9}{'MFU':>7}   per round")
    for r in results:
        mfu = f"{100 * r['vit_train_mfu']:.1f}%" if r["vit_train_mfu"] is not None else "-"
        print(f"{r['precision']:<10}{r['vit_train_images_per_s']:>16.1f}{r['timm_images_per_s']:>12.1f}"
              f"{r['ratio']:>8.3f}{r['vit_train_tflops']:>9.3f}{mfu:>7}   {' '.join(f'{x:.3f}' for x in r['ratios'])}")
    for r in results:
        if "mae_over_classify" in r:
            print(f"MAE pre-training at mask ratio {args.mae_ratio} ({r['precision']}): {r['mae_images_per_s']:.1f} "
                  f"img/s = {r['mae_over_classify']:.2f}x classification training of the same encoder   per round "
                  f"{' '.join(f'{x:.2f}' for x in r['mae_ratios'])}")
    if pipelines:
        print(f"pipelines (aug=basic, images/s): on-device {pipelines['device_images_per_s']:.0f}, DataLoader "
              f"({args.workers} workers) {pipelines['loader_images_per_s']:.0f}; on-device / vit_train training = "
              f"{pipelines['device_over_training']:.1f}x")
    if "distill" in extras:
        d = extras["distill"]
        print(f"distillation ({d['teacher']} teacher, {args.precision.split(',')[0]}): {1e3 * d['distill_step_s']:.1f} ms "
              f"per step against {1e3 * d['plain_step_s']:.1f} ms plain: x{d['ratio']:.2f}")
    if "options" in extras:
        o = extras["options"]
        print(f"options (reg_tokens=4, init_values, qk_norm): on / off x{o['on_over_off']:.3f}; off / timm's twin "
              f"x{o['off_over_timm']:.3f} ({1e3 * o['off_step_s']:.1f} / {1e3 * o['timm_off_step_s']:.1f} ms per step)")


if __name__ == "__main__":
    main()
