"""Using a trained checkpoint: its weights (model or EMA), prediction and export.

A checkpoint carries everything needed here: the config (so the model can be rebuilt), the class
names and the preprocessing (resize, crop, normalisation), so no data set is needed.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Literal

import torch
from PIL import Image

from .checkpoint import load_checkpoint
from .config import Config
from .data.decode import IMAGE_ERRORS, open_rgb
from .errors import CheckpointError, ConfigError, DataError
from .extras import available, require
from .mae import MaskedAutoencoder, build_mae
from .model import VisionTransformer, build_model
from .preprocess import eval_spec, eval_transform
from .pretrained import resize_pos_embed
from .weights import ema_weights, export_safetensors

log = logging.getLogger("vit_train")

Weights = Literal["auto", "model", "ema"]


def load_for_inference(path: str | Path, weights: Weights = "auto",
                       overrides: dict | None = None) -> tuple[VisionTransformer, Config, dict, str]:
    """(model in eval mode on the CPU, config, checkpoint, "model" or "ema") from a vit-train checkpoint.

    weights=auto takes the EMA weights when the checkpoint has them. `overrides` (plain nested dict)
    are merged into the saved config, e.g. another data root; the model's shape cannot change, but
    model.img_size can: learned positions are then interpolated as for fine-tuning (bicubic).
    """
    ckpt = load_checkpoint(Path(path))
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
    source = "ema" if weights == "ema" or (weights == "auto" and ckpt.get("ema")) else "model"
    mae = cfg.objective.name == "mae"  # a masked-autoencoder pre-training checkpoint (docs/mae.md)
    resized = cfg.model.img_size != ckpt["config"]["model"]["img_size"]
    if mae and resized:
        raise ConfigError(f"model.img_size cannot change for a masked-autoencoder checkpoint (trained at "
                          f"{ckpt['config']['model']['img_size']}); evaluate it at its own size")
    model = build_mae(cfg) if mae else build_model(cfg.model, len(ckpt["class_names"]))
    state = ema_weights(ckpt["ema"]) if source == "ema" else ckpt["model"]
    model.load_state_dict(state if mae else at_size(model, state))
    if resized:
        log.info("evaluating at %dx%d, trained at %dx%d: positions interpolated", cfg.model.img_size,
                 cfg.model.img_size, ckpt["config"]["model"]["img_size"], ckpt["config"]["model"]["img_size"])
        ckpt = {**ckpt, "preprocess": None}  # the preprocessing follows the new size
    return model.eval(), cfg, ckpt, source


def at_size(model: VisionTransformer, weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`weights` with pos_embed fitted to `model`'s patch grid: learned positions resized (bicubic, prefix
    positions kept), a fixed sin-cos table replaced by the model's own."""
    own = model.state_dict().get("pos_embed")
    if own is None or weights["pos_embed"].shape == own.shape:
        return weights
    if not isinstance(model.pos_embed, torch.nn.Parameter):
        return {**weights, "pos_embed": own}
    pos = resize_pos_embed(weights["pos_embed"], model.num_prefix_tokens, model.patch_embed.grid_size,
                           source_prefix=model.num_prefix_tokens)
    return {**weights, "pos_embed": pos}


def _merge(base: dict, extra: dict) -> dict:
    out = dict(base)
    for key, value in extra.items():
        out[key] = _merge(base.get(key) or {}, value) if isinstance(value, dict) else value
    return out


def read_image(path: str | Path) -> Image.Image:
    """`path` as an RGB image, decoded as the training loader decodes it (data/decode.py)."""
    try:
        return open_rgb(path)
    except FileNotFoundError:
        raise DataError(f"image {path} does not exist") from None
    except IMAGE_ERRORS as e:
        raise DataError(f"{path} cannot be read as an image ({type(e).__name__}: {str(e)[:200]})") from None


@torch.no_grad()
def predict(model: VisionTransformer, ckpt: dict, cfg: Config, files: list[str], top_k: int = 5) -> list[dict]:
    """For each file, the `top_k` classes with their probabilities, most likely first."""
    refuse_pretraining(model, "predicts no classes")
    if not files:
        raise ConfigError("no images given: images=[a.jpg,b.png]")
    transform = eval_transform(ckpt.get("preprocess") or eval_spec(cfg))
    batch = torch.stack([transform(read_image(f)) for f in files])
    probs = model(batch).float().softmax(dim=1)
    top = probs.topk(min(top_k, probs.shape[1]), dim=1)
    names = ckpt["class_names"]
    return [{"file": str(f), "top": [{"class": names[i], "probability": p}
                                     for p, i in zip(values.tolist(), indices.tolist())]}
            for f, values, indices in zip(files, top.values, top.indices)]


def export(model: VisionTransformer, cfg: Config, ckpt: dict, source: str, fmt: str, out: Path) -> dict[str, Any]:
    """Write the weights as safetensors (config, class names, preprocessing in the metadata) or ONNX
    (input 'images' with a dynamic batch axis, output 'logits'); returns what was written and checked."""
    out.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "safetensors":
        export_safetensors(ckpt, out, source)
        return {"path": str(out), "format": fmt, "weights": source}
    if fmt != "onnx":
        raise ConfigError(f"format must be safetensors or onnx; got {fmt!r}")
    return {"path": str(out), "format": fmt, "weights": source, **export_onnx(model, cfg.model.img_size, out)}


def refuse_pretraining(model: torch.nn.Module, what: str) -> None:
    """A masked-autoencoder checkpoint (objective mae) has no classifier: one line on what to do instead."""
    if isinstance(model, MaskedAutoencoder):
        raise ConfigError(f"this is a masked-autoencoder pre-training checkpoint (objective=mae); it {what}. "
                          f"Fine-tune it first: vit-train model.pretrained=<its run directory> (docs/mae.md)")


def export_onnx(model: VisionTransformer, img_size: int, out: Path) -> dict[str, Any]:
    refuse_pretraining(model, "has no classifier to export to ONNX (format=safetensors writes its weights)")
    require("onnx", "ONNX export")
    require("onnxscript", "ONNX export")
    example = torch.randn(2, 3, img_size, img_size)
    batch = torch.export.Dim("batch", min=1)
    torch.onnx.export(model, (example,), str(out), input_names=["images"], output_names=["logits"],
                      dynamic_shapes={"x": {0: batch}}, dynamo=True, verbose=False)
    if not available("onnxruntime"):
        log.warning("onnxruntime is not installed, so the ONNX file was not checked against PyTorch")
        return {"checked": False}
    import onnxruntime

    check = torch.randn(3, 3, img_size, img_size)  # another batch size than the example's
    session = onnxruntime.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    got = torch.from_numpy(session.run(None, {"images": check.numpy()})[0])
    with torch.no_grad():
        diff = (got - model(check)).abs().max().item()
    if diff > 1e-3:
        raise CheckpointError(f"the ONNX model's outputs differ from PyTorch's by {diff:.2e}; {out} is not trustworthy")
    return {"checked": True, "max_abs_diff": diff}

