"""vit-export format=hf: a trained ViT as the folder timm's `save_for_hf` writes (the Hub's layout), which
`timm.create_model("local-dir:DIR", pretrained=True)` loads offline with the same logits, and which
`model.pretrained=DIR` and `objective.teacher=DIR` read back with their identity.

The folder: config.json (timm's: `architecture`, `num_classes`, `num_features`, `global_pool`, `label_names`,
`model_args` building the same network, `pretrained_cfg` with vit-train's evaluation preprocessing as timm reads
it), model.safetensors (the weights under timm's names, which are vit-train's, with vit-train's metadata: config,
class names, identity), README.md (a model card: the run's results and recipe). Written beside `out` and renamed
into place, so a failed export leaves no half folder and an earlier export stays until the new one is whole.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path
from typing import Any

import yaml

from vit_train.checkpoint import HUB_FILES, export_safetensors, exported_folder, timm_layout, weights_identity
from vit_train.errors import ConfigError, UserError
from vit_train.objectives.base import Objective
from vit_train.outputs.places import os_error_of, place_error
from vit_train.tools.inference import Trained

RECIPE = ("model", "data", "aug", "optim", "schedule", "objective", "trainer")  # the config's sections in the card


def export_hf(trained: Trained, out: Path) -> dict[str, Any]:
    """Write `trained`'s weights (its model's or EMA's, as loaded) as a Hub folder at `out`; returns what was
    written: {"path", "format": "hf", "weights", "architecture", "files"}.

    Raises ConfigError (one line, nothing written) for a model timm cannot build (`timm_layout`: another family, a
    probe's BatchNorm, ...), one that predicts no classes (an MAE pre-training run), and an `out` that exists and
    is neither empty nor an earlier export; OutputError when `out` cannot be written (no temporary folder left)."""
    objective = trained.cfg.objective
    assert isinstance(objective, Objective)  # the schema builds each objective's own option
    objective.refuse_prediction(
        "has no classifier to export in the Hub's layout (format=safetensors writes its weights)"
    )
    weights = dict(trained.model.state_dict())
    name, model_args = timm_layout(trained.checkpoint["config"]["model"], weights, len(trained.class_names))
    out = Path(os.path.abspath(out))  # out=. or out=..: a name of its own (the temporary folder is its sibling)
    check_out(out)
    config = hub_config(trained, name, model_args)
    card = model_card(trained, name, out.name)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    old = out.with_name(f".{out.name}.old-{os.getpid()}")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        export_safetensors(trained.checkpoint, tmp / "model.safetensors", trained.source, trained.preprocess)
        (tmp / "config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        (tmp / "README.md").write_text(card, encoding="utf-8")
        for path in tmp.iterdir():
            with open(path, "rb") as f:
                os.fsync(f.fileno())
        if out.exists():  # an earlier export (check_out): set aside until the new one is in place
            os.replace(out, old)
        os.replace(tmp, out)
        shutil.rmtree(old, ignore_errors=True)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if old.exists() and not out.exists():
            os.replace(old, out)
        failed = None if isinstance(e, UserError) else os_error_of(e)
        if failed is None:
            raise
        raise place_error(failed, out, otherwise="give another out=") from None
    return {
        "path": str(out),
        "format": "hf",
        "weights": trained.source,
        "architecture": name,
        "files": sorted(p.name for p in out.iterdir()),
    }


def check_out(out: Path) -> None:
    """ConfigError (one line) when `out` is a file, or a folder that is neither empty nor an earlier export
    (only vit-export's files, its model.safetensors written by vit-train): replacing it would lose what it holds."""
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise ConfigError(f"out={out} is a file; format=hf writes a folder: give a folder's name")
    if not out.is_dir():
        return
    names = sorted(p.name for p in out.iterdir())
    if names and (set(names) - set(HUB_FILES) or not exported_folder(out)):
        shown = ", ".join(names[:4]) + (", ..." if len(names) > 4 else "")
        raise ConfigError(
            f"out={out} is a folder that holds other files than an earlier export ({shown}); give a new or empty "
            f"folder (an earlier format=hf export there is replaced)"
        )


def hub_config(trained: Trained, name: str, model_args: dict[str, Any]) -> dict[str, Any]:
    """config.json as timm's `save_for_hf` writes it: the name and the arguments that build the network, the
    classes, and `pretrained_cfg` (input size, mean, std, interpolation and crop_pct of vit-train's evaluation
    preprocessing: bilinear resize of the short side to size / crop_pct, centre crop)."""
    spec = trained.preprocess
    size = int(spec["size"])
    return {
        "architecture": name,
        "num_classes": len(trained.class_names),
        "num_features": model_args["embed_dim"],
        "global_pool": model_args["global_pool"],
        "label_names": list(trained.class_names),
        "model_args": model_args,
        "pretrained_cfg": {
            "tag": "vit-train",
            "custom_load": False,
            "input_size": [3, size, size],
            "fixed_input_size": True,
            "interpolation": "bilinear",
            "crop_pct": crop_pct(size, int(spec["resize"])),
            "crop_mode": "center",
            "mean": list(spec["mean"]),
            "std": list(spec["std"]),
            "num_classes": len(trained.class_names),
            "pool_size": None,
            "first_conv": "patch_embed.proj",
            "classifier": ["head", "head_dist"] if "head_dist" in trained.model.state_dict() else "head",
        },
    }


def crop_pct(size: int, resize: int) -> float:
    """timm's crop_pct for a resize of the short side to `resize` before the centre crop of `size`: the float
    nearest size / resize for which timm's floor(size / crop_pct) gives `resize` (224/256: 0.875; at some sizes the
    plain quotient floors one pixel short)."""
    pct = size / resize
    while math.floor(size / pct) < resize:
        pct = math.nextafter(pct, 0.0)
    return pct


def model_card(trained: Trained, name: str, title: str) -> str:
    """README.md: front matter the Hub reads (tags, library timm), then what the weights are, the run's results
    (its results.json, when the checkpoint lies in a run directory), how to load them, and the recipe."""
    config = trained.checkpoint["config"]
    identity = weights_identity(trained.checkpoint, trained.source) or trained.identity or {}
    results = run_results(trained.path)
    data = config.get("data") or {}
    score = identity.get("score") or {}
    lines = [
        "---",
        "tags:",
        "- image-classification",
        "- timm",
        "- vit-train",
        "library_name: timm",
        "pipeline_tag: image-classification",
        "---",
        f"# Model card for {title}",
        "",
        f"A Vision Transformer trained with vit-train, in timm's layout ({name} with config.json's model_args).",
        "",
        "## Model Details",
        f"- **Architecture:** timm `{name}`, {config['model'].get('depth')} blocks of width "
        f"{config['model'].get('embed_dim')}, {config['model'].get('num_heads')} heads, "
        f"patch {config['model'].get('patch_size')}",
        f"- **Parameters (M):** {sum(v.numel() for v in trained.model.state_dict().values()) / 1e6:.3f}",
        f"- **Image size:** {trained.preprocess['size']} x {trained.preprocess['size']}",
        f"- **Dataset:** {data.get('name', 'unknown')} ({len(trained.class_names)} classes)",
        f"- **Weights:** {'the EMA' if trained.source == 'ema' else 'the model'}'s, at step {identity.get('step')}"
        + (f", val {score.get('metric')} {score.get('value'):.2f}" if score.get("value") is not None else ""),
        f"- **Run:** {identity.get('run_id') or 'unknown'}",
        "",
        "## Results",
    ]
    if results:
        lines += [f"- **{k}:** {v}" for k, v in results.items()]
    else:
        lines.append("No results.json beside the checkpoint (the weights were exported from a file outside a run).")
    lines += [
        "",
        "## Model Usage",
        "```python",
        "import timm",
        f'model = timm.create_model("local-dir:{title}", pretrained=True).eval()',
        "config = timm.data.resolve_data_config({}, model=model)",
        "transform = timm.data.create_transform(**config)",
        "```",
        f"In vit-train: `model.pretrained={title}` or `objective.teacher={title}`.",
        "",
        "## Recipe",
        "The run's config (vit-train's keys):",
        "```yaml",
        yaml.safe_dump({k: config[k] for k in RECIPE if k in config}, sort_keys=False).rstrip(),
        "```",
        "",
    ]
    return "\n".join(lines)


# results.json's keys the card shows, in this order
RESULT_KEYS = (
    "status",
    "best_top1",
    "best_step",
    "best_source",
    "final_top1",
    "final_top5",
    "final_ema_top1",
    "epochs",
    "steps",
    "images_per_s",
    "wall_seconds",
)


def run_results(path: Path) -> dict[str, Any]:
    """The run's results.json (the shown keys), when the checkpoint `path` lies in a run's checkpoints/."""
    run_dir = path.parent.parent if path.parent.name == "checkpoints" else path.parent
    try:
        results = json.loads((run_dir / "results.json").read_text())
    except (OSError, ValueError):
        return {}
    return {k: results[k] for k in RESULT_KEYS if isinstance(results, dict) and results.get(k) is not None}
