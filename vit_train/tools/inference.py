"""A trained checkpoint ready for use: the one door vit-eval, vit-predict and vit-export take (`load_for_inference`),
which gives the model (its weights, model or EMA, rebuilt at its size or another) with its config, class names,
identity and preprocessing (`Trained`).

A checkpoint carries everything needed here: the config (so the model can be rebuilt), the class
names and the preprocessing (resize, crop, normalisation), so no data set is needed.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch

from vit_train.checkpoint import best_weights, open_weights
from vit_train.config import Config
from vit_train.data.sources.base import DataSource
from vit_train.errors import CheckpointError, ConfigError
from vit_train.models.architecture import architecture, differing
from vit_train.objectives.weights_in import first_difference
from vit_train.schema import legacy

log = logging.getLogger("vit_train")

Weights = Literal["auto", "model", "ema"]


@dataclass(frozen=True)
class Trained:
    """A trained model ready for use, and what using it needs (`load_for_inference`)."""

    model: torch.nn.Module  # in eval mode on the CPU, its weights loaded: the objective's model (MAE: the autoencoder)
    cfg: Config  # the checkpoint's config, upgraded, with the caller's overrides (another data root, model.img_size)
    path: Path  # the file read: the one given, or a run directory's best.pt (else its newest readable checkpoint)
    source: str  # which weights: "model" or "ema"
    identity: dict[str, Any] | None  # run id, objective, architecture, class names; which weights, their step, score
    checkpoint: dict[str, Any]  # the file's contents; for a .safetensors file, made of its metadata and weights

    @property
    def class_names(self) -> list[str]:
        return list(self.checkpoint["class_names"])

    @property
    def step(self) -> int | None:
        return self.checkpoint.get("step")

    @property
    def trained_size(self) -> int:
        """The image size the weights were trained at (the config's model.img_size may be another)."""
        return self.checkpoint["config"]["model"]["img_size"]

    @property
    def preprocess(self) -> dict[str, Any]:
        """How an image becomes the input: the checkpoint's, or at another model.img_size the config's."""
        return self.checkpoint.get("preprocess") or self.cfg.data.eval_spec(self.cfg.model.img_size)


def auto_weights(ckpt: dict) -> tuple[str, str]:
    """("model" or "ema", why) for weights=auto: the weights that scored best for this checkpoint, by the
    rule training follows (checkpoint/scores.py `best_weights`: the objective's direction, the model
    winning a tie)."""
    return best_weights(ckpt)


def load_for_inference(given: str | Path, weights: Weights = "auto", overrides: dict | None = None) -> Trained:
    """The trained model `given` names, in eval mode on the CPU, with its config, class names and identity.

    `given` goes through the door for weights (vit_train/checkpoint/ `open_weights`): a .pt checkpoint, a run
    directory (its best.pt) or a .safetensors file written by vit-export; weights=auto takes the weights that scored best for a checkpoint (`auto_weights`)
    and logs which and why. `overrides` (plain nested dict) are merged into the saved config, e.g. another data
    root; the model's shape cannot change, but model.img_size can: learned positions are then interpolated as for
    fine-tuning (bicubic).
    Raises ConfigError, CheckpointError (one line): a plain state dict names no network to rebuild.
    """
    incoming = open_weights(given, "ckpt", weights, said_as=f"weights={weights}")
    path = given
    if incoming.config is None:
        raise ConfigError(
            f"ckpt={path} is a state dict without a vit-train config: it names no network to rebuild; "
            f"give a vit-train checkpoint, run directory or vit-export .safetensors, or train from "
            f"these weights (vit-train model.pretrained=<it>)"
        )
    if not incoming.class_names:
        raise CheckpointError(
            f"ckpt={path} records no class names, so its predictions cannot be named; train from its "
            f"weights on your data (vit-train model.pretrained=<it>)"
        )
    ckpt = incoming.checkpoint or {
        "config": incoming.config,
        "class_names": incoming.class_names,
        "ema": None,
        "model": incoming.weights,
        "step": (incoming.identity or {}).get("step"),
        "preprocess": (incoming.metadata or {}).get("preprocess"),
        "identity": incoming.identity,
    }
    if incoming.checkpoint is None and incoming.source == "ema":  # an export of EMA weights: they are the model here
        ckpt = {**ckpt, "ema": {f"module.{k}": v for k, v in incoming.weights.items()}}
    Config.from_saved({**ckpt["config"], "resume": None}, source=path)  # its own config first: a cause of its own
    plain = _merge(legacy.upgrade_saved(ckpt["config"]), overrides or {})
    changed = [
        f"model.{k}" for k in plain["model"] if plain["model"][k] != ckpt["config"]["model"].get(k) and k != "img_size"
    ]
    if changed:
        raise ConfigError(f"{', '.join(changed)} cannot change for a trained checkpoint (model.img_size can)")
    cfg = Config.from_dict({**plain, "resume": None})
    source = incoming.source if incoming.source in ("model", "ema") else "model"
    trained_size = ckpt["config"]["model"]["img_size"]
    resized = cfg.model.img_size != trained_size
    state = incoming.weights
    # the model its objective trained (a classifier; MAE: the autoencoder, at its own size only)
    try:
        model = cfg.objective.inference_model(cfg, trained_size, len(ckpt["class_names"]), state)
    except RuntimeError as e:  # load_state_dict's: tensors that do not fit the network the file's own config names
        if not str(e).startswith("Error(s) in loading state_dict"):
            raise  # another failure (an objective's own code): its own message, not a damaged file
        if resized:
            _refuse_size(path, plain, len(ckpt["class_names"]), state, trained_size, e)
        raise _damaged(path, e) from None
    if resized:
        learned = isinstance(getattr(model, "pos_embed", None), torch.nn.Parameter)
        log.info(
            "evaluating at %dx%d, trained at %dx%d: %s",
            cfg.model.img_size,
            cfg.model.img_size,
            ckpt["config"]["model"]["img_size"],
            ckpt["config"]["model"]["img_size"],
            "learned positions interpolated (bicubic)" if learned else "fixed sin-cos positions recomputed",
        )
        ckpt = {**ckpt, "preprocess": None}  # the preprocessing follows the new size
    return Trained(model.eval(), cfg, incoming.path, source, incoming.identity, ckpt)


def _refuse_size(path, plain: dict, classes: int, state: dict, trained_size: int, error: RuntimeError) -> None:
    """The cause when weights that fit no network at model.img_size are asked to run there: ConfigError when
    they fit at their trained size (a network whose shape follows the image size: a ResNet's stem), naming
    what differs (models/architecture.py); CheckpointError (`_damaged`) when they fit at neither size."""
    saved = {**plain["model"], "img_size": trained_size}
    cfg = Config.from_dict({**plain, "model": saved, "resume": None})
    try:
        cfg.objective.inference_model(cfg, trained_size, classes, state)
    except RuntimeError as e:  # no fit at its own size either: what differs there
        raise _damaged(path, e) from None
    size = plain["model"]["img_size"]
    found = [
        f"{key}={there} at {size}, {here} as trained"
        for key, there, here in differing(architecture(plain["model"]), architecture(saved))
    ]
    why = (
        f"the network is another at that size ({', '.join(found)})"
        if found
        else f"its weights do not fit the network at that size ({first_difference(error)})"
    )
    raise ConfigError(
        f"ckpt={path} cannot run at model.img_size={size}: {why}; evaluate at "
        f"model.img_size={trained_size} (its own size: leave model.img_size out)"
    )


def _damaged(path, error: RuntimeError) -> CheckpointError:
    return CheckpointError(
        f"ckpt={path}: its weights do not fit the network its config names "
        f"({first_difference(error)}); the file was edited or damaged: do not use it as it is"
    )


def _merge(base: dict, extra: dict) -> dict:
    """`base` with `extra` merged in, section by section; a section of another option (`data=NAME` given to
    vit-eval: its whole section, cli/commands.py `group_file`) replaces the saved one, but for the keys of how
    the images are read (data.batch_size, data.num_workers, ...: `DataSource.loading_keys`), kept unless given."""
    out = dict(base)
    for key, value in extra.items():
        other = isinstance(value, dict) and "name" in value and value["name"] != (base.get(key) or {}).get("name")
        if other and key == "data":  # how the images are read (batch size, workers) carries over unless given
            value = {**{k: v for k, v in (base.get(key) or {}).items() if k in DataSource.loading_keys}, **value}
        out[key] = value if other else _merge(base.get(key) or {}, value) if isinstance(value, dict) else value
    return out
