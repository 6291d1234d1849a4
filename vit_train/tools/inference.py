"""Using a trained checkpoint: its weights (model or EMA), prediction and export.

A checkpoint carries everything needed here: the config (so the model can be rebuilt), the class
names and the preprocessing (resize, crop, normalisation), so no data set is needed.
"""

from __future__ import annotations

import contextlib
import io
import logging
import warnings
from pathlib import Path
from typing import Any, Literal

import torch
from PIL import Image

from vit_train.outputs.checkpoint import checkpoint_file, load_checkpoint
from vit_train.config.schema import Config
from vit_train.data.decode import IMAGE_ERRORS, open_rgb
from vit_train.errors import CheckpointError, ConfigError, DataError
from vit_train.extras import available, require
from vit_train.models.mae import MaskedAutoencoder
from vit_train.models.vit import VisionTransformer
from vit_train.objectives import objective_of
from vit_train.objectives.score import best_weights
from vit_train.data.preprocess import eval_spec, eval_transform
from vit_train.outputs.weights import ema_weights, export_safetensors

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


def export(model: VisionTransformer, cfg: Config, ckpt: dict, source: str, fmt: str, out: Path,
           verbose: bool = False) -> dict[str, Any]:
    """Write the weights as safetensors (config, class names, preprocessing in the metadata) or ONNX
    (input 'images' with a dynamic batch axis, output 'logits'); returns what was written and checked.
    The ONNX exporter's progress messages are shown only with `verbose`."""
    out.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "safetensors":
        export_safetensors(ckpt, out, source)
        return {"path": str(out), "format": fmt, "weights": source}
    if fmt != "onnx":
        raise ConfigError(f"format must be safetensors or onnx; got {fmt!r}")
    return {"path": str(out), "format": fmt, "weights": source, **export_onnx(model, cfg.model.img_size, out, verbose)}


def refuse_pretraining(model: torch.nn.Module, what: str) -> None:
    """A masked-autoencoder checkpoint (objective mae) has no classifier: one line on what to do instead."""
    if isinstance(model, MaskedAutoencoder):
        raise ConfigError(f"this is a masked-autoencoder pre-training checkpoint (objective=mae); it {what}. "
                          f"Fine-tune it first: vit-train model.pretrained=<its run directory> (docs/mae.md)")


@contextlib.contextmanager
def _logging_off():
    """No log records at all (every logger, every level) inside the block."""
    logging.disable(logging.CRITICAL)
    try:
        yield
    finally:
        logging.disable(logging.NOTSET)


def export_onnx(model: VisionTransformer, img_size: int, out: Path, verbose: bool = False) -> dict[str, Any]:
    refuse_pretraining(model, "has no classifier to export to ONNX (format=safetensors writes its weights)")
    require("onnx", "ONNX export")
    require("onnxscript", "ONNX export")
    example = torch.randn(2, 3, img_size, img_size)
    batch = torch.export.Dim("batch", min=1)
    chatter = io.StringIO()
    with contextlib.ExitStack() as quiet:
        if not verbose:  # "[torch.onnx] Obtain model graph ... ✅" and the like
            quiet.enter_context(contextlib.redirect_stdout(chatter))
            quiet.enter_context(contextlib.redirect_stderr(chatter))
            quiet.enter_context(warnings.catch_warnings())
            quiet.enter_context(_logging_off())  # "Replaced initializer ..." comes through logging, not stderr
            warnings.simplefilter("ignore")
        try:
            torch.onnx.export(model, (example,), str(out), input_names=["images"], output_names=["logits"],
                              dynamic_shapes={"x": {0: batch}}, dynamo=True, verbose=verbose)
        except Exception as e:
            detail = (chatter.getvalue().strip().splitlines() or [""])[-1]
            raise CheckpointError(f"the ONNX export failed ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                                  f"{'; ' + detail if detail else ''}); rerun with verbose=true to see the exporter's "
                                  f"messages") from None
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

