"""Timm's Hub folder: what timm's `save_for_hf` writes, what the Hub serves and `timm.create_model("local-dir:DIR")`
reads. A folder with config.json (`architecture`: a timm model name; `num_classes`; `label_names`; `model_args`: the
keyword arguments that build the network; `pretrained_cfg`: input size, mean, std, interpolation, crop_pct) beside
model.safetensors (the state dict under timm's names, which are vit-train's).

Two ways across: a vit-train ViT as timm's `VisionTransformer` (`timm_layout`, for vit-export format=hf), and a
folder's config.json as the architecture fields and class names the door for weights compares (`hub_record`):
what it states beyond what tensors show (the head count, the pooling) makes a timm folder as checkable as a
vit-train file. A folder exported by vit-train also carries vit-train's identity record in model.safetensors'
metadata; config.json must agree with it (`hub_contradictions`).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import torch

from vit_train.errors import CheckpointError, ConfigError
from vit_train.models.architecture import revealed
from vit_train.schema.legacy import saved_arch

CONFIG, WEIGHTS = "config.json", "model.safetensors"
CARD = "README.md"
FILES = (CONFIG, WEIGHTS, CARD)  # what vit-export format=hf writes
# timm's named ViT and DeiT sizes (timm/models/vision_transformer.py, deit.py): (embed_dim, depth, num_heads), MLP 4x
SIZES = {
    "tiny": (192, 12, 3),
    "small": (384, 12, 6),
    "base": (768, 12, 12),
    "large": (1024, 24, 16),
    "huge": (1280, 32, 16),
}
# timm's plain ViT names (timm.list_models, timm 1.0): a size's name is used when the patch and image sizes match one
TIMM_NAMES = {
    f"vit_{n}"
    for n in (
        "tiny_patch16_224 tiny_patch16_384 small_patch8_224 small_patch16_224 small_patch16_384 small_patch32_224 "
        "small_patch32_384 base_patch8_224 base_patch16_224 base_patch16_384 base_patch32_224 base_patch32_384 "
        "large_patch14_224 large_patch16_224 large_patch16_384 large_patch32_224 large_patch32_384 huge_patch14_224"
    ).split()
}
NAMED = re.compile(r"^(vit|deit)_(tiny|small|base|large|huge)_(distilled_)?patch(\d+)_(\d+)$")
# timm's global_pool -> model.pool; the others pool what this ViT cannot
POOLS = {"token": "cls", "avg": "mean"}


def is_hub_folder(path: Path) -> bool:
    """Whether the folder `path` is meant as a Hub folder: it holds config.json or model.safetensors and is no run
    directory (which holds checkpoints/)."""
    return not (path / "checkpoints").is_dir() and ((path / CONFIG).exists() or (path / WEIGHTS).exists())


def timm_layout(model: dict[str, Any], weights: dict[str, torch.Tensor], num_classes: int) -> tuple[str, dict]:
    """(timm's model name, model_args) that build a vit-train model section (`model`, a saved config's) as timm's
    network with the same function, for `weights` (the state dict exported). The name is timm's for the size when
    one matches (vit_small_patch16_224), else the nearest named width's; model_args give every size and option,
    so timm builds the same network whatever the name's defaults.

    Raises ConfigError (one line, why, and that format=safetensors writes the weights) for what timm's
    VisionTransformer cannot build: another family (a ResNet), a linear probe's BatchNorm before the head, a
    distillation token beside registers or without a class token."""
    arch = saved_arch(model)
    fallback = "format=safetensors writes its weights for vit-train and for loading by hand"
    if arch != "vit":
        raise ConfigError(
            f"format=hf writes timm's VisionTransformer layout, and this checkpoint is a model.arch={arch}, "
            f"whose layout vit-train does not export as timm's; {fallback}"
        )
    if any(k.startswith("head_norm.") for k in weights):
        raise ConfigError(
            "format=hf: this linear probe normalises features with a BatchNorm before the head (head_norm, "
            f"model.trainable=head), which timm's VisionTransformer lacks; {fallback}"
        )
    distilled = bool(model.get("distilled"))
    pool = model.get("pool", "cls")
    if distilled and (pool != "cls" or model.get("reg_tokens")):
        raise ConfigError(
            "format=hf: timm's distilled ViT (VisionTransformerDistilled) has a class token and no registers, and "
            f"this one has model.pool={pool} model.reg_tokens={model.get('reg_tokens') or 0}; {fallback}"
        )
    dim, depth, heads = model["embed_dim"], model["depth"], model["num_heads"]
    patch, size = model["patch_size"], model["img_size"]
    mlp = float(model.get("mlp_ratio", 4.0))
    named = next((n for n, s in SIZES.items() if s == (dim, depth, heads) and mlp == 4.0), None)
    nearest = named or min(SIZES, key=lambda n: abs(SIZES[n][0] - dim))
    if distilled:
        name = f"deit_{nearest if nearest in ('tiny', 'small') else 'base'}_distilled_patch16_224"
    elif f"vit_{named}_patch{patch}_{size}" in TIMM_NAMES:
        name = f"vit_{named}_patch{patch}_{size}"
    else:  # a size of one's own: the nearest named width's name, model_args give the rest
        name = f"vit_{nearest}_patch{14 if nearest == 'huge' else 16}_224"
    args: dict[str, Any] = {
        "img_size": size,
        "patch_size": patch,
        "embed_dim": dim,
        "depth": depth,
        "num_heads": heads,
        "mlp_ratio": mlp,
        "qkv_bias": bool(model.get("qkv_bias", True)),
        "class_token": pool == "cls",
        "global_pool": "token" if pool == "cls" else "avg",
        "fc_norm": False,  # timm's default for avg pooling is a norm after pooling instead of the final norm
        "num_classes": num_classes,
    }
    if model.get("reg_tokens"):
        args["reg_tokens"] = int(model["reg_tokens"])
    if model.get("init_values"):
        args["init_values"] = float(model["init_values"])
    if model.get("qk_norm"):
        args["qk_norm"] = True
    return name, args


def label_names(config: dict[str, Any]) -> list[str] | None:
    """The class names config.json records, in label order: `label_names` at its top, in its pretrained_cfg, or
    timm's older `labels`; a mapping {index: name} counts when it names every index from 0. None when it records
    none or has gaps (the names of some logits unknown)."""
    pretrained = _mapping(config.get("pretrained_cfg"))
    names = next(
        (n for n in (config.get("label_names"), pretrained.get("label_names"), config.get("labels")) if n), None
    )
    if isinstance(names, dict):
        try:
            indexed = {int(k): str(v) for k, v in names.items()}
        except (TypeError, ValueError):
            return None
        return [indexed[i] for i in range(len(indexed))] if set(indexed) == set(range(len(indexed))) else None
    if isinstance(names, list) and all(isinstance(n, str) for n in names):
        return names
    return None


def stated_architecture(config: dict[str, Any], weights: dict[str, torch.Tensor], said: str) -> dict[str, Any]:
    """The architecture fields config.json states beyond the tensors: the head count (model_args, else timm's
    named size) and the pooling (global_pool). Raises ConfigError (one line) for a network this ViT cannot compute
    whatever its tensors: another pooling (attention, max), the mean beside a class token, another activation."""
    args = _mapping(config.get("model_args"))
    found: dict[str, Any] = {}
    named = NAMED.match(str(config.get("architecture", "")))
    if named:
        found["model.num_heads"] = SIZES[named.group(2)][2]
    if isinstance(args.get("num_heads"), int):
        found["model.num_heads"] = args["num_heads"]
    act = args.get("act_layer")
    if act not in (None, "gelu"):
        raise ConfigError(
            f"{said} is a ViT with act_layer={act!r} (its config.json); this ViT computes GELU, so its "
            f"weights would compute another function: give weights of a classic ViT"
        )
    pool = args.get("global_pool", config.get("global_pool"))
    if pool is None:
        return found
    token = "cls_token" in weights
    if pool not in POOLS or (pool == "avg" and token) or (pool == "token" and not token):
        what = (
            "the mean of the patch tokens beside a class token"
            if pool == "avg"
            else "the first patch token, having no class token"
            if pool == "token"
            else "by another rule"
        )
        raise ConfigError(
            f"{said} pools {what} (timm's global_pool={pool!r}, its config.json); this ViT pools a class "
            f"token or the mean of a model without one, so it cannot compute that network"
        )
    found["model.pool"] = POOLS[pool]
    return found


def hub_record(config: dict[str, Any], weights: dict[str, torch.Tensor], said: str) -> dict[str, Any]:
    """The identity record (models/architecture.py `identity`'s fields) a Hub folder's config.json and tensors
    give: the architecture the tensors show with what config.json states (`stated_architecture`), the class
    names (`label_names`); no run id, no objective."""
    return {
        "run_id": None,
        "objective": None,
        "architecture": {**revealed(weights), **stated_architecture(config, weights, said)},
        "class_names": label_names(config),
    }


def hub_contradictions(config: dict[str, Any], record: dict[str, Any], theirs: dict[str, Any]) -> list[str]:
    """Where a vit-train export's config.json (`config`, read as `theirs` by `hub_record`) disagrees with the
    identity record its model.safetensors carries (`record`): class names, class count, architecture fields."""
    found = []
    names, ours = theirs.get("class_names"), record.get("class_names")
    if names is not None and ours is not None and list(names) != list(ours):
        found.append("its config.json's label_names differ from its weights' class names")
    count = config.get("num_classes")
    if isinstance(count, int) and ours is not None and count != len(ours):
        found.append(f"its config.json says num_classes={count}, its weights have {len(ours)} class names")
    arch = record.get("architecture") or {}
    for key, value in theirs["architecture"].items():
        if key in arch and arch[key] is not None and value is not None and arch[key] != value:
            found.append(f"{key}={value} in its config.json, {arch[key]} in its weights' record")
    return found


def read_config(folder: Path, said: str) -> dict[str, Any]:
    """A Hub folder's config.json as a mapping; CheckpointError (one line) when it cannot be read or is no
    mapping with an architecture."""
    try:
        config = json.loads((folder / CONFIG).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
        raise CheckpointError(f"{said}: its config.json cannot be read as JSON ({type(e).__name__}: {e})") from None
    if not isinstance(config, dict) or not isinstance(config.get("architecture"), str):
        raise CheckpointError(
            f"{said}: its config.json names no architecture (timm's save_for_hf writes one); it is no Hub folder "
            f"of timm's"
        )
    return config


def missing_files(folder: Path) -> list[str]:
    """The files a Hub folder must hold (config.json, model.safetensors) that `folder` lacks."""
    return [name for name in (CONFIG, WEIGHTS) if not (folder / name).is_file()]


def hub_model(record: dict[str, Any], config: dict[str, Any]) -> dict[str, Any] | None:
    """A vit-train model section (model.* keys) that builds the network a timm Hub folder holds, from its identity
    record (`hub_record`) and config.json's image size; None when the folder does not say all of it (the head count
    of a timm name of one's own without model_args) or it is no ViT."""
    arch = record.get("architecture") or {}
    if arch.get("model.arch") != "vit" or arch.get("model.num_heads") is None or arch.get("model.pool") is None:
        return None
    args, pretrained = _mapping(config.get("model_args")), _mapping(config.get("pretrained_cfg"))
    size = args.get("img_size") or (pretrained.get("input_size") or [None, None])[-1]
    size = size[-1] if isinstance(size, list) else size
    named = NAMED.match(str(config.get("architecture", "")))
    if not isinstance(size, int):
        size = int(named.group(5)) if named else None
    if size is None:
        return None
    keys = ("patch_size", "embed_dim", "depth", "num_heads", "mlp_ratio", "qkv_bias", "pool", "pos_embed")
    model = {"name": str(config["architecture"]), "arch": "vit", "img_size": size}
    model.update({k: arch.get(f"model.{k}") for k in keys})
    model.update(
        reg_tokens=arch.get("model.reg_tokens") or 0,
        init_values=(args.get("init_values") or 1e-5) if arch.get("model.init_values") else None,  # gammas replace it
        qk_norm=bool(arch.get("model.qk_norm")),
        distilled=bool(arch.get("model.distilled")),
    )
    return model if all(model[k] is not None for k in keys) else None


def _mapping(value: Any) -> dict[str, Any]:
    """`value` when it is a mapping (a config.json section), else an empty one."""
    return value if isinstance(value, dict) else {}
