"""Throughput in FLOP terms: training FLOPs per image (counted once, on the meta device) and the
peak FLOP/s of known GPUs, for model FLOP utilisation (MFU) = achieved FLOP/s / peak."""

from __future__ import annotations

import torch
from torch.utils.flop_counter import FlopCounterMode

from .config import ModelConfig
from .model import build_model

# Dense peak TFLOP/s by datasheet, by GPU name fragment: (bf16/fp16 tensor cores, tf32).
PEAKS = {
    "H200": (989.0, 494.0), "H100": (989.0, 494.0), "GH200": (989.0, 494.0), "B200": (2250.0, 1100.0),
    "A100": (312.0, 156.0), "A10G": (70.0, 35.0), "L40S": (362.0, 183.0), "L4": (121.0, 60.0),
    "RTX 4090": (165.0, 82.6), "RTX 3090": (71.0, 35.6), "V100": (125.0, 15.7), "T4": (65.0, 8.1),
}


def flops_per_image(cfg: ModelConfig, num_classes: int) -> float:
    """Training FLOPs (forward and backward) for one image through the full ViT, every token through
    every block, as model FLOP utilisation counts them. With class-token pooling the loop's forward
    skips most of the last block for the patch tokens, so it executes ~6% fewer FLOPs than this."""
    with torch.device("meta"):
        model = build_model(cfg, num_classes)
        images = torch.empty(1, 3, cfg.img_size, cfg.img_size)
    with FlopCounterMode(display=False) as counter:
        logits = model.forward_head(model.forward_features(images)) if cfg.arch == "vit" else model(images)
        logits.sum().backward()
    return float(counter.get_total_flops())


def peak_tflops(device: torch.device, dtype: torch.dtype | None, override: float | None,
                name: str | None = None) -> float | None:
    """`trainer.peak_tflops` if set, else the datasheet figure for this GPU and precision; None when unknown."""
    if override:
        return override
    if device.type != "cuda":
        return None
    name = name or torch.cuda.get_device_name(device)
    for fragment, (half, tf32) in PEAKS.items():
        if fragment in name:
            return half if dtype in (torch.bfloat16, torch.float16) else tf32
    return None
