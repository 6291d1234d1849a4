"""Start from saved weights (`model.pretrained`): a vit-train checkpoint or run directory (its
checkpoints/last.pt), safetensors or a timm state dict. From a masked-autoencoder run (objective
mae) the encoder is taken (`encoder.` prefix stripped) and its decoder dropped; the head is new.

Keys that fit are loaded; learned position embeddings are resized by bicubic interpolation when the
patch grid differs; the head is left freshly initialised when the class count differs; keys this
model lacks are ignored. Any other shape mismatch is an error that names the key.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

import torch
import torch.nn.functional as F

from .checkpoint import load_weights
from .errors import ConfigError
from .model import VisionTransformer

log = logging.getLogger("vit_train")


def resize_pos_embed(pos: torch.Tensor, num_prefix: int, grid: int, source_prefix: int | None = None) -> torch.Tensor:
    """Position embeddings (1, P + g*g, D) resized to `num_prefix` prefix tokens and a grid x grid patch grid.

    The source's prefix count P is `source_prefix`, or when not given read from its length (0 or 1
    class token); prefix positions are kept, dropped or added as zeros to match `num_prefix`.
    """
    tokens, dim = pos.shape[1], pos.shape[2]
    if source_prefix is None:
        source_prefix = 0 if math.isqrt(tokens) ** 2 == tokens else 1
    side = math.isqrt(tokens - source_prefix)
    if side * side != tokens - source_prefix:
        raise ConfigError(f"pretrained pos_embed has {tokens} tokens, which is no square patch grid (plus a class "
                          f"token); these weights do not come from a ViT of this kind")
    prefix, patches = pos[:, :source_prefix], pos[:, source_prefix:]
    if side != grid:
        patches = patches.reshape(1, side, side, dim).permute(0, 3, 1, 2).float()
        patches = F.interpolate(patches, size=(grid, grid), mode="bicubic", align_corners=False, antialias=side > grid)
        patches = patches.permute(0, 2, 3, 1).reshape(1, grid * grid, dim).to(pos.dtype)
    prefix = prefix[:, :num_prefix] if source_prefix >= num_prefix else torch.zeros(1, num_prefix, dim, dtype=pos.dtype)
    return torch.cat([prefix, patches], dim=1)


def encoder_weights(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A masked autoencoder's state dict (encoder.*, decoder.*) -> its encoder's, as a VisionTransformer's;
    any other state dict unchanged."""
    if not any(k.startswith("encoder.") for k in weights) or not any(k.startswith("decoder.") for k in weights):
        return weights
    encoder = {k.removeprefix("encoder."): v for k, v in weights.items() if k.startswith("encoder.")}
    log.info("model.pretrained holds a masked autoencoder: its encoder is loaded, its decoder (%d tensors) dropped",
             len(weights) - len(encoder))
    return encoder


def load_pretrained(model: VisionTransformer, path: str | Path) -> dict[str, list[str]]:
    """Load what fits of the weights in `path` into `model`; returns (and logs) what happened to each key."""
    path = Path(path).expanduser()
    if path.is_dir():  # a run directory: where that run ended
        path = path / "checkpoints" / "last.pt" if (path / "checkpoints").is_dir() else path / "last.pt"
    if not path.is_file():
        raise ConfigError(f"model.pretrained={path} does not exist; give a vit-train run directory or checkpoint "
                          f"(.pt), a .safetensors file or a timm state dict (.pth)")
    weights, _ = load_weights(path)
    weights = encoder_weights({k.removeprefix("module.").removeprefix("_orig_mod."): v for k, v in weights.items()})
    own = model.state_dict()
    fixed_pos = not isinstance(getattr(model, "pos_embed", None), torch.nn.Parameter)
    report: dict[str, list[str]] = {"loaded": [], "resized": [], "reinitialised": [], "ignored": []}
    chosen = {}
    for key, value in weights.items():
        if key not in own or (key == "pos_embed" and fixed_pos):
            report["ignored"].append(key)
        elif value.shape == own[key].shape:
            chosen[key] = value
            report["loaded"].append(key)
        elif key == "pos_embed":
            chosen[key] = resize_pos_embed(value, model.num_prefix_tokens, model.patch_embed.grid_size)
            report["resized"].append(f"pos_embed {tuple(value.shape)} -> {tuple(own[key].shape)}")
        elif key.startswith(("head.", "head_dist.", "fc.")):  # the ViT's heads, a ResNet's classifier
            report["reinitialised"].append(f"{key} ({value.shape[0]} classes in the file, {own[key].shape[0]} here)")
        else:
            raise ConfigError(f"model.pretrained: {key} has shape {tuple(value.shape)} in {path.name} but "
                              f"{tuple(own[key].shape)} in this model; set the model's embed_dim, depth, num_heads, "
                              f"mlp_ratio and patch_size to those of the weights")
    skipped = {k.split(" ")[0] for k in report["reinitialised"]}
    report["reinitialised"] += [k for k in own if k not in weights and k not in skipped
                                and not (k == "pos_embed" and fixed_pos)]
    if not report["loaded"]:
        raise ConfigError(f"model.pretrained: no tensor in {path} fits this model (its keys start "
                          f"{', '.join(list(weights)[:3])}); it does not hold ViT weights with timm's names")
    model.load_state_dict(chosen, strict=False)
    log.info("pretrained weights from %s: %d tensors loaded; resized: %s; re-initialised: %s; ignored: %s", path,
             len(report["loaded"]), ", ".join(report["resized"]) or "none",
             ", ".join(report["reinitialised"]) or "none", ", ".join(report["ignored"]) or "none")
    return report
