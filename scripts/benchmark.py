"""Training throughput of this project's ViT against timm's VisionTransformer, in one process.

Both models get the same shape and the same weights; each round times a few full training steps
(forward, backward, AdamW step) of each, interleaved, so machine noise hits both alike. Reports
images/s per model and precision and the ratio ours / timm (median over rounds).

    python scripts/benchmark.py                                  # vit_tiny, 32x32, patch 4, batch 128
    python scripts/benchmark.py --model vit_small --img-size 224 --patch-size 16 --batch-size 64
    python scripts/benchmark.py --precision fp32,bf16 --rounds 5 --json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch
from omegaconf import OmegaConf

from vit_train.config import ModelConfig
from vit_train.model import build_model
from vit_train.evaluate import autocast_dtype

CONFIGS = Path(__file__).resolve().parents[1] / "configs" / "model"


def timm_twin(model: torch.nn.Module, cfg: ModelConfig, num_classes: int) -> torch.nn.Module:
    from timm.models.vision_transformer import VisionTransformer

    pool = dict(global_pool="token") if cfg.pool == "cls" else dict(global_pool="avg", class_token=False, fc_norm=False)
    twin = VisionTransformer(img_size=cfg.img_size, patch_size=cfg.patch_size, num_classes=num_classes,
                             embed_dim=cfg.embed_dim, depth=cfg.depth, num_heads=cfg.num_heads,
                             mlp_ratio=cfg.mlp_ratio, qkv_bias=cfg.qkv_bias, **pool)
    twin.load_state_dict(model.state_dict())
    return twin


def images_per_second(model: torch.nn.Module, batch: tuple, steps: int, dtype: torch.dtype | None,
                      device: torch.device) -> float:
    images, targets = batch
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda")

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
            loss = torch.nn.functional.cross_entropy(model(images), targets)
        loss.backward()
        optimizer.step()

    step()  # warm-up: allocations, kernel selection, compilation
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return steps * len(images) / (time.perf_counter() - start)


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
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    args = parser.parse_args()

    device = torch.device("cuda" if args.device != "cpu" and torch.cuda.is_available() else "cpu")
    cfg = ModelConfig(**{**OmegaConf.to_container(OmegaConf.load(CONFIGS / f"{args.model}.yaml")),
                         "img_size": args.img_size, "patch_size": args.patch_size})
    torch.manual_seed(0)
    ours = build_model(cfg, args.num_classes).to(device)
    models = {"vit_train": ours, "timm": timm_twin(ours, cfg, args.num_classes).to(device)}
    if args.compile:
        models = {name: torch.compile(m) for name, m in models.items()}
    batch = (torch.randn(args.batch_size, 3, args.img_size, args.img_size, device=device),
             torch.randint(0, args.num_classes, (args.batch_size,), device=device))

    results = []
    for precision in args.precision.split(","):
        dtype = autocast_dtype(precision, device)
        rounds = {name: [] for name in models}
        for _ in range(args.rounds):
            for name, model in models.items():
                rounds[name].append(images_per_second(model, batch, args.steps, dtype, device))
        ratios = [a / b for a, b in zip(rounds["vit_train"], rounds["timm"])]
        results.append({"precision": precision, **{f"{n}_images_per_s": statistics.median(r) for n, r in rounds.items()},
                        "ratio": statistics.median(ratios), "ratios": ratios})

    setting = {"model": args.model, "img_size": args.img_size, "patch_size": args.patch_size,
               "batch_size": args.batch_size, "device": str(device), "compile": args.compile,
               "threads": torch.get_num_threads(), "torch": str(torch.__version__), "machine": platform.machine(),
               "gpu": torch.cuda.get_device_name() if device.type == "cuda" else None}
    if args.json:
        print(json.dumps({"setting": setting, "results": results}, indent=2))
        return
    print(", ".join(f"{k}={v}" for k, v in setting.items()))
    print(f"{'precision':<10}{'vit_train img/s':>16}{'timm img/s':>12}{'ratio':>8}   per round")
    for r in results:
        print(f"{r['precision']:<10}{r['vit_train_images_per_s']:>16.1f}{r['timm_images_per_s']:>12.1f}"
              f"{r['ratio']:>8.3f}   {' '.join(f'{x:.3f}' for x in r['ratios'])}")


if __name__ == "__main__":
    main()
