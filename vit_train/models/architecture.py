"""A network's architecture as data: every field that changes the function it computes, under the
user's key (`model.num_heads`, ...), so that weights crossing from one run into another can be
compared with the network they go into (objectives/weights_in.py) and a refusal names what to set.

Two sources: a config's model section (`architecture`: vit-train checkpoints and exports carry it in
their identity record, outputs/identity.py), and the tensors of a state dict under timm's names
(`revealed`: what the shapes and names show of a timm, torchvision or plain file). Shapes cannot show
the number of attention heads (it splits the same qkv matrix differently), or (timm's global_pool)
whether a model with a class token pooled the mean: a class token is read as model.pool=cls. Only a
record says those. Positions are read from their values (`position_kind`): a table equal to the fixed
2-D sin-cos one is sincos2d, any other learned (learned positions may hold the sin-cos values they
started from: a linear probe of an MAE encoder keeps them, so sincos2d in the tensors does not refute
a record's learned).

Not in the architecture: the image size (learned positions are resized to it), dropout and drop path
(training only), `model.trainable`; the class count is the head's and is compared by class names.
"""

from __future__ import annotations

import re
from typing import Any

import torch

from vit_train.models.cnn import SMALL_IMAGE_MAX

BLOCK = re.compile(r"^blocks\.(\d+)\.")
RESNET_BLOCK = re.compile(r"^layer(\d)\.(\d+)\.")
# the order fields are listed in a refusal, as the model section lists them
FIELDS = ("model.arch", "model.stem", "model.patch_size", "model.embed_dim", "model.depth", "model.num_heads",
          "model.mlp_ratio", "model.qkv_bias", "model.pool", "model.pos_embed", "model.reg_tokens",
          "model.init_values", "model.qk_norm", "model.distilled")


def architecture(model: dict[str, Any]) -> dict[str, Any]:
    """The function-changing fields of a config's model section (a plain dict, as checkpoints keep it).

    ViT: patch size, width, depth, heads, MLP ratio, qkv bias, pooling (and so the class token), positions, registers,
    LayerScale (on or off: the loaded gammas replace model.init_values), QK-norm, distillation token.
    ResNet: its name and stem (the 3x3 stride-1 stem up to SMALL_IMAGE_MAX pixels, models/cnn.py).
    """
    arch = model.get("arch", "vit")
    if arch != "vit":
        small = (model.get("img_size") or 224) <= SMALL_IMAGE_MAX
        return {"model.arch": arch, "model.stem": "3x3 (small images)" if small else "7x7 (ImageNet)"}
    return {"model.arch": "vit", "model.patch_size": model.get("patch_size"), "model.embed_dim": model.get("embed_dim"),
            "model.depth": model.get("depth"), "model.num_heads": model.get("num_heads"),
            "model.mlp_ratio": float(model.get("mlp_ratio", 4.0)), "model.qkv_bias": bool(model.get("qkv_bias", True)),
            "model.pool": model.get("pool", "cls"),
            "model.pos_embed": model.get("pos_embed", "learned"), "model.reg_tokens": int(model.get("reg_tokens") or 0),
            "model.init_values": model.get("init_values") not in (None, 0),
            "model.qk_norm": bool(model.get("qk_norm", False)), "model.distilled": bool(model.get("distilled", False))}


def revealed(weights: dict[str, torch.Tensor]) -> dict[str, Any]:
    """What the tensors of a state dict (timm's names, wrappers removed) show of its architecture: the
    fields of `architecture` that shapes and names determine. A ResNet (torchvision's names) shows its
    depth-defining block counts as its name when they are torchvision's resnet18/34/50/101/152."""
    if any(RESNET_BLOCK.match(k) for k in weights):
        return _resnet(weights)
    proj = weights.get("patch_embed.proj.weight")
    if proj is None:
        return {}
    dim = proj.shape[0]
    fc1 = weights.get("blocks.0.mlp.fc1.weight")
    reg = weights.get("reg_token")
    return {"model.arch": "vit", "model.patch_size": proj.shape[-1], "model.embed_dim": dim,
            "model.depth": len({int(m.group(1)) for k in weights if (m := BLOCK.match(k))}),
            **({"model.mlp_ratio": fc1.shape[0] / dim} if fc1 is not None else {}),
            "model.qkv_bias": "blocks.0.attn.qkv.bias" in weights if "blocks.0.attn.qkv.weight" in weights else None,
            "model.pool": "cls" if "cls_token" in weights else "mean", "model.reg_tokens": reg.shape[1] if reg is not None else 0,
            **({"model.pos_embed": position_kind(weights)} if "pos_embed" in weights else {}),
            "model.init_values": any(k.endswith((".ls1.gamma", ".ls2.gamma")) for k in weights),
            "model.qk_norm": any(".attn.q_norm." in k for k in weights),
            "model.distilled": "dist_token" in weights}


def position_kind(weights: dict[str, torch.Tensor]) -> str:
    """"sincos2d" when the patch positions of `weights["pos_embed"]` (1, P + g*g, D) equal the fixed 2-D sin-cos
    table (models/vit.py `sincos_2d`, MoCo v3's and MAE's) to 1e-4 after some count P of prefix positions that
    are zero (as the fixed table's are), else "learned"."""
    from vit_train.models.vit import sincos_2d

    pos = weights["pos_embed"]
    if pos.dim() != 3 or pos.shape[-1] % 4:
        return "learned"
    tokens, dim = pos.shape[1], pos.shape[2]
    prefix = ("cls_token" in weights) + ("dist_token" in weights) + (weights["reg_token"].shape[1] if "reg_token" in weights else 0)
    for count in range(min(prefix, tokens), -1, -1):  # the prefix positions zero, as the fixed table has them
        side = int((tokens - count) ** 0.5)
        if side * side == tokens - count and side > 0 and torch.allclose(
                pos[0, count:].float(), sincos_2d(side, dim), atol=1e-4, rtol=0) and not pos[0, :count].any():
            return "sincos2d"
    return "learned"


def positions_exempt(theirs: dict[str, Any], ours: dict[str, Any]) -> tuple[str, ...]:
    """("model.pos_embed",) when sin-cos positions meet learned ones (`ours`): learned positions may start
    from, or keep, the fixed table (MAE's fine-tuning, a linear probe), so the two are the same function there."""
    fixed_into_learned = theirs.get("model.pos_embed") == "sincos2d" and ours.get("model.pos_embed") == "learned"
    return ("model.pos_embed",) if fixed_into_learned else ()


RESNETS = {(2, 2, 2, 2, False): "resnet18", (3, 4, 6, 3, False): "resnet34", (3, 4, 6, 3, True): "resnet50",
           (3, 4, 23, 3, True): "resnet101", (3, 8, 36, 3, True): "resnet152"}


def _resnet(weights: dict[str, torch.Tensor]) -> dict[str, Any]:
    blocks = [len({m.group(2) for k in weights if (m := RESNET_BLOCK.match(k)) and m.group(1) == str(i)})
              for i in range(1, 5)]
    bottleneck = any(k.endswith(".conv3.weight") for k in weights)
    conv1 = weights.get("conv1.weight")
    found = {"model.arch": RESNETS.get((*blocks, bottleneck), f"a ResNet with blocks {blocks}")}
    if conv1 is not None:
        found["model.stem"] = "3x3 (small images)" if conv1.shape[-1] == 3 else "7x7 (ImageNet)"
    return found


def head_classes(weights: dict[str, torch.Tensor]) -> int | None:
    """The class count of a state dict's classifier head (ViT `head`, ResNet `fc`); None when it has none."""
    head = weights.get("head.weight", weights.get("fc.weight"))
    return head.shape[0] if head is not None and head.dim() == 2 else None


def differences(theirs: dict[str, Any], ours: dict[str, Any], exempt: tuple[str, ...] = ()) -> list[str]:
    """The fields both know that differ, as "model.num_heads=4 (here 2)", in FIELDS order (`differing`)."""
    return [f"{key}={a} (here {b})" for key, a, b in differing(theirs, ours, exempt)]


def differing(theirs: dict[str, Any], ours: dict[str, Any], exempt: tuple[str, ...] = ()) -> list[tuple[str, str, str]]:
    """(field, its value in `theirs`, in `ours`), as the command line writes them, for the fields both know
    that differ, in FIELDS order; `exempt` fields are not compared, None on either side means unknown.
    Another model.arch is the only difference given: the other fields of another kind do not compare."""
    out = []
    for key in FIELDS:
        if key in exempt or theirs.get(key) is None or ours.get(key) is None or theirs[key] == ours[key]:
            continue
        if key == "model.arch" or (theirs.get("model.arch") == ours.get("model.arch")):
            out.append((key, _shown(key, theirs[key]), _shown(key, ours[key])))
        if key == "model.arch":
            break
    return out


def _shown(key: str, value: Any) -> str:
    if key == "model.init_values":
        return "set" if value else "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float) and value.is_integer():
        return f"{value:g}"
    return str(value)


def identity(config: dict[str, Any], class_names: list[str] | None, run_id: str | None) -> dict[str, Any]:
    """The identity record a vit-train checkpoint carries (under "identity") and an export copies: the run
    it came from (`run_id`, made at the run's start and kept across resumes; None for checkpoints written
    before it existed), the objective, the architecture of the network its weights are for (of the
    encoder for a masked autoencoder) and the class names in label order. Which weights (model or EMA),
    their step and score are added where one set is taken (objectives/weights_in.py)."""
    return {"run_id": run_id, "objective": (config.get("objective") or {}).get("name"),
            "architecture": architecture(config.get("model") or {}),
            "class_names": list(class_names) if class_names is not None else None}


def architecture_of(model: torch.nn.Module) -> dict[str, Any]:
    """The architecture of a built network: what its tensors reveal, plus its head count, pooling and
    position kind (a ViT's attributes)."""
    found = revealed(model.state_dict())
    blocks = getattr(model, "blocks", None)
    if blocks is not None and len(blocks):
        found["model.num_heads"] = blocks[0].attn.num_heads
    if hasattr(model, "pos_embed"):
        found["model.pos_embed"] = "learned" if isinstance(model.pos_embed, torch.nn.Parameter) else "sincos2d"
    if isinstance(getattr(model, "pool", None), str):
        found["model.pool"] = model.pool
    return found
