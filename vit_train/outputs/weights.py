"""Weights in and out: reading a state dict from any file vit-train accepts (its checkpoints,
safetensors, plain or DeiT/Lightning-style state dicts), the EMA's weights inside a checkpoint, and
the one safetensors writer (vit-export)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

from vit_train.errors import CheckpointError
from vit_train.extras import require
from vit_train.outputs.integrity import archive_damage, legacy_damage, load_failure as _load_failure


def ema_weights(ema_state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The model's state dict inside an AveragedModel's (keys 'module.*', plus its 'n_averaged'), without
    the names of any wrapper inside it (an EMA of a compiled or DDP-wrapped model: `strip_wrappers`)."""
    return strip_wrappers({k.removeprefix("module."): v for k, v in ema_state.items() if k.startswith("module.")})


def saved_ema(ema_state: dict[str, torch.Tensor] | None) -> dict[str, torch.Tensor] | None:
    """An AveragedModel's state dict as a checkpoint keeps it: 'module.' + the plain model's names (the names
    timm reads, whatever wrapped the averaged model), and its 'n_averaged'. None stays None."""
    if ema_state is None:
        return None
    extra = {k: v for k, v in ema_state.items() if k == "n_averaged"}
    return {**{f"module.{k}": v for k, v in ema_weights(ema_state).items()}, **extra}


def export_safetensors(ckpt: dict[str, Any], path: Path, source: str = "model", spec: dict | None = None) -> None:
    """A checkpoint's weights, the model's or (`source="ema"`) the EMA's, as safetensors, with what
    using them needs as metadata: the config, the class names, the preprocessing (the checkpoint's, else
    `spec`: vit-export's from the config), the source and the identity record (run id, architecture, class
    names; which weights, their step and val score)."""
    weights = ema_weights(ckpt["ema"]) if source == "ema" else ckpt["model"]
    spec = ckpt.get("preprocess") or spec
    identity = weights_identity(ckpt, source)
    save_safetensors(weights, path, {"config": ckpt["config"], "class_names": ckpt["class_names"], "preprocess": spec,
                                     "weights": source, **({"identity": identity} if identity else {})})


def weights_identity(ckpt: dict[str, Any], source: str) -> dict[str, Any] | None:
    """A checkpoint's identity record (train/state.py writes it; models/architecture.py `identity`) for
    one set of its weights: with "weights" (`source`), "step" and "score" (`eval_score`). None for a
    checkpoint written before the record (the door for weights rebuilds it from the config)."""
    if not ckpt.get("identity"):
        return None
    record = {**ckpt["identity"], "weights": source}
    if "step" not in record:  # a checkpoint's record; an export's says its step and score already
        record.update(step=ckpt.get("step"), score=eval_score(ckpt, source))
    return record


def eval_score(ckpt: dict[str, Any], source: str) -> dict[str, Any] | None:
    """{"metric", "value", "step"} of the weights `source` ("model" or "ema") at a checkpoint's last
    evaluation (`last_eval`), None when it records none."""
    last = ckpt.get("last_eval") or {}
    if source in last:  # "partial": scored on a share of the val set (trainer.limit_val_batches)
        return {"metric": last.get("metric") or "top1", "value": last[source], "step": last.get("step"),
                **({"partial": True} if last.get("partial") else {})}
    return None


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
    return {".".join(p for p in k.split(".") if p not in WRAPPERS): v for k, v in weights.items()
            if k.split(".")[-1] != "n_averaged"}


def load_weights(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """(state dict, metadata) from a .safetensors file, a vit-train checkpoint or a plain state dict."""
    weights, metadata, _ = read_weights(path)
    return weights, metadata


def read_weights(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any], dict[str, Any] | None]:
    """(state dict, metadata, the whole checkpoint or None) from a .safetensors file (metadata: what
    vit-export wrote, JSON-decoded), a vit-train checkpoint (its model's weights; metadata: config and
    class names; the checkpoint itself, for its EMA and scores), a DeiT {"model": ...} or Lightning
    {"state_dict": ...} file, or a plain state dict. Raises CheckpointError (one line) for anything else."""
    path = Path(path)
    if path.suffix == ".safetensors":
        require("safetensors", "the safetensors format", error=CheckpointError)
        from safetensors import SafetensorError, safe_open

        try:
            with safe_open(str(path), framework="pt") as f:
                weights = {k: f.get_tensor(k) for k in f.keys()}
                metadata = f.metadata() or {}
        except (SafetensorError, OSError) as e:
            raise CheckpointError(f"{path} is not a readable safetensors file ({e})") from None
        return weights, {k: _json_or_text(v) for k, v in metadata.items()}, None
    damage = archive_damage(path)
    if damage:
        raise CheckpointError(f"{path} is damaged ({damage}); get a sound copy of it")
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        damage = legacy_damage(path, e)
        if damage:
            raise CheckpointError(f"{path} is damaged ({damage}); get a sound copy of it") from None
        raise CheckpointError(f"{path} cannot be read ({_load_failure(e)})") from None
    for key in ("model", "state_dict"):  # vit-train and DeiT checkpoints; Lightning-style files
        if isinstance(data, dict) and isinstance(data.get(key), dict):
            vit_train = isinstance(data.get("config"), dict) and key == "model"
            return data[key], {"config": data.get("config"), "class_names": data.get("class_names")}, \
                data if vit_train else None
    if isinstance(data, dict) and all(isinstance(v, torch.Tensor) for v in data.values()):
        return data, {}, None
    raise CheckpointError(f"{path} holds neither a vit-train checkpoint nor a state dict of tensors: it holds "
                          f"{_describe(data)}")


def _describe(data: Any) -> str:
    """What a loaded file holds, in a few words (a dict's first keys and their kinds)."""
    if isinstance(data, dict):
        items = ", ".join(f"{k} ({type(v).__name__})" for k, v in list(data.items())[:5])
        return f"a dict of {len(data)} entries: {items}{', ...' if len(data) > 5 else ''}"
    if isinstance(data, torch.Tensor):
        return f"one tensor of shape {tuple(data.shape)}"
    return f"a {type(data).__name__}"


def _json_or_text(value: str) -> Any:
    try:
        return json.loads(value)
    except RecursionError:  # a hostile file: nesting deep enough to exhaust the parser's stack
        raise CheckpointError("safetensors metadata is nested too deeply to be read; this file was not written "
                              "by a trainer, do not use it") from None
    except ValueError:  # metadata written by another tool
        return value
