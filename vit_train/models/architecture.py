"""A network's architecture as data: every field that changes the function it computes, under the
user's key (`model.num_heads`, ...), so that weights crossing from one run into another can be
compared with the network they go into (objectives/weights_in.py) and a refusal names what to set.

Two sources: a config's model section (`architecture`: vit-train checkpoints and exports carry it in
their identity record, checkpoint/identity.py), and the tensors of a state dict under timm's names
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

from typing import Any

import torch

from vit_train.models.families import resnet, vit  # noqa: F401 (the built-in families, whatever imported this)
from vit_train.schema.legacy import saved_arch
from vit_train.schema.typed import options


def fields() -> tuple[str, ...]:
    """The architecture fields, in the order a refusal lists them: model.arch, then each family's."""
    return ("model.arch", *dict.fromkeys(f for cls in options("model").values() for f in cls.ARCHITECTURE))


def architecture(model: dict[str, Any]) -> dict[str, Any]:
    """The function-changing fields of a config's model section (a plain dict, as checkpoints keep it), by its
    family's rule (models/families/): a family not installed here gives its name only."""
    arch = saved_arch(model)
    family = options("model").get(arch)
    return family.architecture(model) if family is not None else {"model.arch": arch}


def revealed(weights: dict[str, torch.Tensor]) -> dict[str, Any]:
    """What the tensors of a state dict (timm's or torchvision's names, wrappers removed) show of its architecture:
    the first family that knows them (models/families/ `reveals`); {} when none does."""
    for family in options("model").values():
        found = family.reveals(weights)
        if found is not None:
            return found
    return {}


def positions_exempt(theirs: dict[str, Any], ours: dict[str, Any]) -> tuple[str, ...]:
    """("model.pos_embed",) when sin-cos positions meet learned ones (`ours`): learned positions may start
    from, or keep, the fixed table (MAE's fine-tuning, a linear probe), so the two are the same function there."""
    fixed_into_learned = theirs.get("model.pos_embed") == "sincos2d" and ours.get("model.pos_embed") == "learned"
    return ("model.pos_embed",) if fixed_into_learned else ()


def head_classes(weights: dict[str, torch.Tensor]) -> int | None:
    """The class count of a state dict's classifier head (ViT `head`, ResNet `fc`); None when it has none."""
    head = weights.get("head.weight", weights.get("fc.weight"))
    return head.shape[0] if head is not None and head.dim() == 2 else None


def differences(theirs: dict[str, Any], ours: dict[str, Any], exempt: tuple[str, ...] = ()) -> list[str]:
    """The fields both know that differ, as "model.num_heads=4 (here 2)", in `fields()` order (`differing`)."""
    return [f"{key}={a} (here {b})" for key, a, b in differing(theirs, ours, exempt)]


def differing(theirs: dict[str, Any], ours: dict[str, Any], exempt: tuple[str, ...] = ()) -> list[tuple[str, str, str]]:
    """(field, its value in `theirs`, in `ours`), as the command line writes them, for the fields both know
    that differ, in `fields()` order; `exempt` fields are not compared, None on either side means unknown.
    Another model.arch is the only difference given: the other fields of another kind do not compare."""
    out = []
    for key in fields():
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
    return {
        "run_id": run_id,
        "objective": (config.get("objective") or {}).get("name"),
        "architecture": architecture(config.get("model") or {}),
        "class_names": list(class_names) if class_names is not None else None,
    }


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
