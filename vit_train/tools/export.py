"""vit-export: a checkpoint's weights for other tools, as safetensors or ONNX."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vit_train.config.schema import Config
from vit_train.errors import ConfigError
from vit_train.models.vit import VisionTransformer
from vit_train.outputs.weights import export_safetensors
from vit_train.tools.onnx_export import export_onnx


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
