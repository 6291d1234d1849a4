"""Using a trained checkpoint: its weights (model or EMA), rebuilt for evaluation, prediction and export.

A checkpoint carries everything needed here: the config (so the model can be rebuilt), the class
names and the preprocessing (resize, crop, normalisation), so no data set is needed.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Literal

import torch

from vit_train.outputs.checkpoint import checkpoint_file, load_checkpoint
from vit_train.config.schema import Config
from vit_train.errors import CheckpointError, ConfigError
from vit_train.models.vit import VisionTransformer
from vit_train.objectives import objective_of
from vit_train.objectives.score import best_weights
from vit_train.outputs.weights import ema_weights

log = logging.getLogger("vit_train")

Weights = Literal["auto", "model", "ema"]


def auto_weights(ckpt: dict) -> tuple[str, str]:
    """("model" or "ema", why) for weights=auto: the weights that scored best for this checkpoint, by the
    rule training follows (objectives/score.py `best_weights`: the objective's direction, the model
    winning a tie)."""
    return best_weights(ckpt)


def load_for_inference(path: str | Path, weights: Weights = "auto",
                       overrides: dict | None = None) -> tuple[VisionTransformer, Config, dict, str]:
    """(model in eval mode on the CPU, config, checkpoint, "model" or "ema") from a vit-train checkpoint.

    `path` is a .pt file or a run directory (its best.pt). weights=auto takes the weights that scored
    best for this checkpoint (`auto_weights`) and logs which and why. `overrides` (plain nested dict)
    are merged into the saved config, e.g. another data root; the model's shape cannot change, but
    model.img_size can: learned positions are then interpolated as for fine-tuning (bicubic).
    Raises ConfigError, CheckpointError.
    """
    ckpt = load_checkpoint(checkpoint_file(path))
    plain = _merge(ckpt["config"], overrides or {})
    changed = [f"model.{k}" for k in plain["model"]
               if plain["model"][k] != ckpt["config"]["model"].get(k) and k != "img_size"]
    if changed:
        raise ConfigError(f"{', '.join(changed)} cannot change for a trained checkpoint (model.img_size can)")
    cfg = Config.from_dict({**plain, "resume": None})
    if weights not in ("auto", "model", "ema"):
        raise ConfigError(f"weights must be auto, model or ema; got {weights!r}")
    if weights == "ema" and not ckpt.get("ema"):
        raise CheckpointError(f"{path} has no EMA weights (the run had trainer.ema_decay=null); use weights=model")
    source = weights
    if weights == "auto":
        source, why = auto_weights(ckpt)
        log.info("weights=auto: the %s weights, as %s (weights=model or weights=ema to choose)",
                 "EMA" if source == "ema" else "model's", why)
    trained_size = ckpt["config"]["model"]["img_size"]
    resized = cfg.model.img_size != trained_size
    state = ema_weights(ckpt["ema"]) if source == "ema" else ckpt["model"]
    # the model its objective trained (a classifier; MAE: the autoencoder, at its own size only)
    model = objective_of(cfg).inference_model(cfg, trained_size, len(ckpt["class_names"]), state)
    if resized:
        learned = isinstance(getattr(model, "pos_embed", None), torch.nn.Parameter)
        log.info("evaluating at %dx%d, trained at %dx%d: %s", cfg.model.img_size, cfg.model.img_size,
                 ckpt["config"]["model"]["img_size"], ckpt["config"]["model"]["img_size"],
                 "learned positions interpolated (bicubic)" if learned else "fixed sin-cos positions recomputed")
        ckpt = {**ckpt, "preprocess": None}  # the preprocessing follows the new size
    return model.eval(), cfg, ckpt, source


def _merge(base: dict, extra: dict) -> dict:
    out = dict(base)
    for key, value in extra.items():
        out[key] = _merge(base.get(key) or {}, value) if isinstance(value, dict) else value
    return out
