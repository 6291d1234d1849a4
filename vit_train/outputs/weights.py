"""Weights out: the names wrappers add to a state dict, removed (`strip_wrappers`: the names timm reads),
and the one safetensors writer (vit-export). Every weights file is read by vit_train/checkpoint/weights.py."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

from vit_train.errors import CheckpointError
from vit_train.extras import require


def save_safetensors(weights: dict[str, torch.Tensor], path: Path, metadata: dict[str, Any]) -> None:
    """The one safetensors writer: a state dict under the names timm reads (wrappers' `module.` and
    `_orig_mod.` removed: `strip_wrappers`), with metadata values stored as JSON text (safetensors keeps
    strings only) beside "format": "vit-train"."""
    require("safetensors", "the safetensors format", error=CheckpointError)
    from safetensors.torch import save_file

    text = {"format": "vit-train", **{k: json.dumps(v) for k, v in metadata.items()}}
    save_file({k: v.contiguous() for k, v in strip_wrappers(weights).items()}, str(path), metadata=text)
    umask = os.umask(0)  # safetensors creates the file owner-only; give it the mode every other output has
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)


# DDP / DataParallel / AveragedModel, torch.compile, FSDP1's units, activation checkpointing's wrapper
# (torch.distributed.algorithms._checkpoint.checkpoint_wrapper); FSDP2 (fully_shard) adds no name
WRAPPERS = ("module", "_orig_mod", "_fsdp_wrapped_module", "_checkpoint_wrapped_module")


def strip_wrappers(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`weights` without the names wrappers add: `module.` (DDP, DataParallel, AveragedModel), `_orig_mod.`
    (torch.compile), `_fsdp_wrapped_module.` (FSDP1) and `_checkpoint_wrapped_module.` (activation
    checkpointing's wrapper), at any depth and in any order; an AveragedModel's `n_averaged` dropped."""
    return {
        ".".join(p for p in k.split(".") if p not in WRAPPERS): v
        for k, v in weights.items()
        if k.split(".")[-1] != "n_averaged"
    }
