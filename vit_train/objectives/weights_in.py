"""Weights from another run or another program into a model (`model.pretrained`, `objective.teacher`): which
files the door takes and what it reads of them is vit_train/checkpoint/weights.py's (`open_weights`); here the
weights are compared with the network they go into (`check_architecture`: every field that changes the function,
naming the keys to set; `check_classes`: the first differing class) and loaded (`load_pretrained`).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from vit_train.checkpoint import Incoming, class_difference, open_weights
from vit_train.errors import ConfigError
from vit_train.models.architecture import differences, positions_exempt, revealed

log = logging.getLogger("vit_train")


def check_architecture(
    incoming: Incoming, ours: dict[str, Any], exempt: tuple[str, ...] = (), theirs: dict[str, Any] | None = None
) -> None:
    """ConfigError (one line) when the weights' architecture (`theirs`, default `incoming.architecture`)
    differs from `ours` (models/architecture.py, of the network they go into) in a field that changes the
    function and is not `exempt`, naming each field with the file's value and ours."""
    found = differences(incoming.architecture if theirs is None else theirs, ours, exempt)
    if found:
        settings = " ".join(f.split(" (")[0] for f in found if f.startswith("model.") and "a ResNet" not in f)
        size = ((incoming.config or {}).get("model") or {}).get("img_size")
        if size and any(f.startswith("model.patch_size=") for f in found):  # keep its token count, and its cost
            settings += f" model.img_size={size}"
        shown = incoming.architecture if theirs is None else theirs
        # another width from a file that cannot show its head count: the line alone would split its qkv wrongly
        heads = (
            ", and model.num_heads as the weights were trained (their tensors cannot show it)"
            if "model.num_heads" not in shown and any(f.startswith("model.embed_dim=") for f in found)
            else ""
        )
        raise ConfigError(
            f"{incoming.key}={incoming.given} holds another network: {', '.join(found)}; "
            f"{'set ' + settings + ' to load it' + heads if settings else 'give weights of this network'} "
            f"(loaded into this one it would compute another function)"
        )


def check_classes(incoming: Incoming, class_names: list[str], advice: str) -> bool:
    """Whether the weights' recorded class names equal `class_names` (same names, same order). When they
    differ, ConfigError (one line) naming the first difference and `advice` (what to do), unless `advice`
    is empty (the caller re-initialises the head, as the user asked): then False. True when they agree
    or when the file records no class names (foreign files: unknown, logged)."""
    theirs = incoming.class_names
    if theirs is None:
        return True
    difference = class_difference(theirs, class_names)
    if difference is None:
        return True
    if not advice:
        return False
    raise ConfigError(
        f"{incoming.key}={incoming.given} was trained on other classes than this data's: {difference}; {advice}"
    )


# the option fields models/pretrained.py `check_options` refuses with the value to set; the distillation
# token and head are head-like: dropped, or freshly initialised, and reported
PRETRAINED_EXEMPT = ("model.distilled", "model.init_values", "model.qk_norm", "model.reg_tokens")


def load_pretrained(
    model: torch.nn.Module, given: str | Path, class_names: list[str] | None = None, reset_head: bool = False
) -> dict[str, list[str]]:
    """`model.pretrained`: the weights `given` names, through the door, into `model` (the classifier, or
    a masked autoencoder's encoder); returns what happened to each key (models/pretrained.py
    `fit_pretrained`).

    Refused (ConfigError, one line, nothing loaded): another architecture (every differing field named),
    a head trained on other classes than `class_names` (the data's; from a file that records them) or, for
    files that record none, on another number of classes, unless `reset_head` (model.reset_head=true:
    fine-tuning to new classes re-initialises the heads)."""
    from vit_train.models.architecture import architecture_of, head_classes
    from vit_train.models.pretrained import fit_pretrained, timm_names

    incoming = open_weights(given, "model.pretrained")
    weights, naming = timm_names(incoming.weights)
    theirs = (
        incoming.identity["architecture"]
        if incoming.identity and incoming.identity.get("architecture")
        else revealed(weights)
    )
    ours = architecture_of(model)
    check_architecture(incoming, ours, PRETRAINED_EXEMPT + positions_exempt(theirs, ours), theirs)
    new_head = _new_head(incoming, head_classes(weights), head_classes(model.state_dict()), class_names, reset_head)
    hub_model = (incoming.metadata or {}).get("hub_model")  # a timm Hub folder's network: its image size, LayerScale
    config = incoming.config or ({"model": hub_model} if hub_model else None)
    return fit_pretrained(model, weights, naming, config, str(incoming.path), new_head)


def _new_head(
    incoming: Incoming, theirs: int | None, ours: int | None, class_names: list[str] | None, reset_head: bool
) -> bool:
    """Whether the heads start fresh: only when asked (model.reset_head=true), or when there is no head to
    keep on one side (a masked autoencoder's encoder, a headless export). Refuses a head of other classes."""
    if theirs is None or ours is None:
        return False
    if reset_head:
        return True
    fix = "add model.reset_head=true to fine-tune to these classes with a new head"
    if class_names is not None and incoming.class_names is not None:
        check_classes(incoming, class_names, fix)
    elif theirs != ours:
        raise ConfigError(
            f"{incoming.key}={incoming.given} has a head for {theirs} classes and the data has {ours}; {fix}"
        )
    elif incoming.class_names is None:
        log.info(
            "%s records no class names: its head (%d classes, as many as the data's) is kept, and whether they "
            "are these classes in this order cannot be checked (model.reset_head=true starts a new head)",
            incoming.key,
            theirs,
        )
    return False


def first_difference(error: RuntimeError) -> str:
    """load_state_dict's error in one short line: the first few missing or unexpected keys, or the shape."""
    lines = str(error).splitlines()
    detail = lines[1].strip() if len(lines) > 1 else str(error)
    return detail if len(detail) <= 200 else detail[:200].rsplit(",", 1)[0] + ', ..."'
