"""vit-export: a checkpoint's weights for other tools, as safetensors or ONNX."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from vit_train.config import Config
from vit_train.errors import ConfigError, UserError
from vit_train.models.vit import VisionTransformer
from vit_train.outputs.places import atomic_file, os_error_of, place_error
from vit_train.outputs.weights import export_safetensors, weights_identity
from vit_train.tools.onnx_export import export_onnx


def export(model: VisionTransformer, cfg: Config, ckpt: dict, source: str, fmt: str, out: Path,
           verbose: bool = False) -> dict[str, Any]:
    """Write the weights as safetensors (config, class names, preprocessing in the metadata) or ONNX
    (input 'images' with a dynamic batch axis, output 'logits', the same metadata as metadata_props:
    `onnx_metadata`); returns what was written and checked. The ONNX exporter's progress messages are
    shown only with `verbose`. Raises ConfigError (another format), CheckpointError, OutputError (`out`
    cannot be written: a full disk, a read-only folder; `out` left as it was, no temporary file)."""
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise place_error(e, out, otherwise="give another out=") from None
    if fmt == "safetensors":
        try:
            with atomic_file(out) as tmp:  # `out` is the earlier export or the complete new one, never half written
                export_safetensors(ckpt, tmp, source, cfg.data.eval_spec(cfg.model.img_size))
        except Exception as e:
            failed = None if isinstance(e, UserError) else os_error_of(e)  # safetensors says "(os error 28)"
            if failed is None:
                raise
            raise place_error(failed, out, otherwise="give another out=") from None
        return {"path": str(out), "format": fmt, "weights": source}
    if fmt != "onnx":
        raise ConfigError(f"format must be safetensors or onnx; got {fmt!r}")
    cfg.objective.refuse_prediction("has no classifier to export to ONNX (format=safetensors writes its weights)")
    written = export_onnx(model, cfg.model.img_size, out, verbose, onnx_metadata(ckpt, cfg, source))
    return {"path": str(out), "format": fmt, "weights": source, **written}


def onnx_metadata(ckpt: dict, cfg: Config, source: str) -> dict[str, str]:
    """What running an exported model needs, as ONNX metadata_props (strings; lists as JSON):
    "class_names" (JSON list, index = logit), "img_size" (the input's side in pixels), "resize" (the
    short side is resized to this before the centre crop of img_size), "mean" and "std" (JSON lists,
    per RGB channel, of pixels scaled to [0, 1]), "weights" (model or ema), "config" (the run's
    config, JSON), "identity" (JSON: run id, architecture, class names, which weights, their step and
    score; docs/finetuning.md) and "format": "vit-train"."""
    spec = ckpt.get("preprocess") or cfg.data.eval_spec(cfg.model.img_size)
    identity = weights_identity(ckpt, source)  # run id, architecture, class names; which weights, step, score
    return {"format": "vit-train", "class_names": json.dumps(ckpt["class_names"], ensure_ascii=False),
            "img_size": str(spec["size"]), "resize": str(spec["resize"]), "mean": json.dumps(spec["mean"]),
            "std": json.dumps(spec["std"]), "weights": source, "config": json.dumps(ckpt["config"]),
            **({"identity": json.dumps(identity, ensure_ascii=False)} if identity else {})}
