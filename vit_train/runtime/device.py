"""The device and precision a run uses (trainer.device, trainer.precision)."""

from __future__ import annotations

import torch

from vit_train.errors import ConfigError


def pick_device(name: str, index: int | None = None) -> torch.device:
    """The device trainer.device names; `index`: which GPU (a process's local rank under torchrun)."""
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("trainer.device=cuda but no CUDA GPU is visible; use trainer.device=auto or cpu")
    cuda = name != "cpu" and torch.cuda.is_available()
    device = torch.device("cuda", index) if cuda and index is not None else torch.device("cuda" if cuda else "cpu")
    if device.type == "cuda":
        torch.set_float32_matmul_precision("high")  # TF32 for fp32 matmuls on Ampere and newer
        torch.backends.cudnn.allow_tf32 = True
    return device


def autocast_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype, or None for full fp32."""
    if precision == "auto":
        return torch.bfloat16 if device.type == "cuda" and torch.cuda.is_bf16_supported() else None
    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": None}[precision]
