"""vit-export: a checkpoint's weights for other tools, as safetensors or ONNX."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from vit_train.checkpoint import export_safetensors, weights_identity
from vit_train.errors import ConfigError, UserError
from vit_train.outputs.places import atomic_file, os_error_of, place_error
from vit_train.tools.inference import Trained
from vit_train.tools.onnx_export import export_onnx


def export(trained: Trained, fmt: str, out: Path, verbose: bool = False) -> dict[str, Any]:
    """Write the `trained` model's weights as safetensors (config, class names, preprocessing in the metadata) or ONNX
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
                export_safetensors(trained.checkpoint, tmp, trained.source, trained.preprocess)
        except Exception as e:
            failed = None if isinstance(e, UserError) else os_error_of(e)  # safetensors says "(os error 28)"
            if failed is None:
                raise
            raise place_error(failed, out, otherwise="give another out=") from None
        return {"path": str(out), "format": fmt, "weights": trained.source}
    if fmt != "onnx":
        raise ConfigError(f"format must be safetensors or onnx; got {fmt!r}")
    trained.cfg.objective.refuse_prediction(
        "has no classifier to export to ONNX (format=safetensors writes its weights)"
    )
    written = export_onnx(trained.model, trained.cfg.model.img_size, out, verbose, onnx_metadata(trained))
    return {"path": str(out), "format": fmt, "weights": trained.source, **written}


def onnx_metadata(trained: Trained) -> dict[str, str]:
    """What running an exported model needs, as ONNX metadata_props (strings; lists as JSON):
    "class_names" (JSON list, index = logit), "img_size" (the input's side in pixels), "resize" (the
    short side is resized to this before the centre crop of img_size), "mean" and "std" (JSON lists,
    per RGB channel, of pixels scaled to [0, 1]), "weights" (model or ema), "config" (the run's
    config, JSON), "identity" (JSON: run id, architecture, class names, which weights, their step and
    score; docs/finetuning.md) and "format": "vit-train"."""
    spec = trained.preprocess
    identity = weights_identity(trained.checkpoint, trained.source)  # run id, architecture, class names; which weights
    return {
        "format": "vit-train",
        "class_names": json.dumps(trained.class_names, ensure_ascii=False),
        "img_size": str(spec["size"]),
        "resize": str(spec["resize"]),
        "mean": json.dumps(spec["mean"]),
        "std": json.dumps(spec["std"]),
        "weights": trained.source,
        "config": json.dumps(trained.checkpoint["config"]),
        **({"identity": json.dumps(identity, ensure_ascii=False)} if identity else {}),
    }
