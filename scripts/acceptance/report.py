"""The acceptance report: the parts' results with the issue's targets attached, as JSON and as one
Markdown table."""

from __future__ import annotations

import fnmatch
import operator

# (part, figure key pattern, comparison, target): the figures the acceptance run must reach on an H200.
TARGETS = [
    ("throughput", "vit_ti4_32.best_images_per_s", ">=", 100_000),
    ("throughput", "vit_s16_224.best_images_per_s", ">=", 12_000),
    ("throughput", "vit_b16_224.best_images_per_s", ">=", 4_500),
    ("throughput", "*.ratio", ">=", 1.0),
    ("data", "device_run.data_wait", "<", 0.05),
    ("decode", "gpu.images_per_s", ">=", 13_200),  # 1.2x ViT-S/16's compiled training target (11,000 img/s)
    ("recipe", "step.images_per_s", ">=", 25_000),  # cifar10_vit_tiny at batch 128: 100 epochs in <= 4 min (H200)
    ("recipe", "step.data_wait", "<", 0.05),
    ("recipe", "*.over_timm", ">=", 1.0),  # never below timm's train.py
    ("recipe", "step.over_timm", ">=", 4.0),
]
COMPARE = {">=": operator.ge, "<": operator.lt}
STATUS_MARK = {"passed": "pass", "failed": "FAIL", "timeout": "TIMEOUT", "error": "FAIL", "skipped": "skipped"}


def build_report(setting: dict, parts: dict[str, dict]) -> dict:
    """{"setting", "parts", "targets", "passed"}: each figure with a target gets "target" and "met";
    "targets" lists them all; "passed" is true when every part ran and passed its checks."""
    targets = []
    for part, pattern, op, value in TARGETS:
        for key, figure in parts.get(part, {}).get("figures", {}).items():
            if fnmatch.fnmatchcase(key, pattern):
                met = figure["value"] is not None and COMPARE[op](figure["value"], value)
                figure.update(target=f"{op} {value_text(value, figure['unit'], key)}", met=met)
                targets.append({"part": part, "figure": key, "label": figure["label"], "value": figure["value"],
                                "target": figure["target"], "met": met})
    add_ratios(parts)
    passed = bool(parts) and all(p["status"] == "passed" for p in parts.values())
    return {"setting": setting, "parts": parts, "targets": targets, "passed": passed}


def add_ratios(parts: dict[str, dict]) -> None:
    """Feeding against training: can each pipeline keep up with the model it feeds?"""
    speed = parts.get("throughput", {}).get("figures", {})
    data = parts.get("data", {}).get("figures", {})
    for feed, model, label in (("cifar_device_images_per_s", "vit_ti4_32.best_images_per_s",
                                "on-device pipeline / ViT-Ti/4 training (above 1: keeps up)"),
                               ("jpeg_loader_images_per_s", "vit_s16_224.best_images_per_s",
                                "JPEG folder loader / ViT-S/16 training (above 1: keeps up)")):
        a, b = data.get(feed, {}).get("value"), speed.get(model, {}).get("value")
        if a and b:
            data[f"{feed.rsplit('_images', 1)[0]}_over_training"] = {"value": a / b, "unit": "x", "label": label}
    decode, training = parts.get("decode", {}).get("figures", {}), speed.get("vit_s16_224.best_images_per_s", {})
    for mode in ("gpu", "cpu"):
        a, b = decode.get(f"{mode}.images_per_s", {}).get("value"), training.get("value")
        if a and b:
            decode[f"{mode}_over_training"] = {"value": a / b, "unit": "x", "label": f"JPEG folder, aug=deit, "
                                               f"decode={mode} / ViT-S/16 training (target for gpu: >= 1.2)"}


def value_text(value, unit: str, key: str) -> str:
    if value is None:
        return "-"
    if key.endswith("_mfu") or unit == "share":
        return f"{100 * value:.1f}%"
    if unit == "img/s":
        return f"{value:,.0f} img/s"
    if unit in ("x", ""):
        return f"{value:.3g}{unit}"
    return f"{value:.4g} {unit}" if unit != "%" else f"{value:.2f}%"


def markdown(report: dict) -> str:
    """One table: per part its status, its checks (pass/FAIL) and its figures (with targets)."""
    s = report["setting"]
    lines = [f"# GPU acceptance: {s.get('gpu') or s.get('device')}, torch {s.get('torch')}, "
             f"{'smoke run (CPU, tiny sizes)' if s.get('smoke') else 'full run'}, {s.get('seconds', 0):.0f} s "
             f"of {s.get('budget_s', 0):.0f} s, {'all parts passed' if report['passed'] else 'NOT all parts passed'}",
             "", "| part | item | value | target | result |", "|---|---|---|---|---|"]
    for name, part in report["parts"].items():
        detail = part.get("error", "").strip().splitlines()[-1:] or [f"{part.get('seconds', 0):.0f} s of "
                                                                     f"{part.get('box_s', 0):.0f} s"]
        lines.append(row(name, "**part**", detail[0], "", STATUS_MARK.get(part["status"], part["status"])))
        for check in part.get("checks", {}).values():
            lines.append(row(name, check["label"], check["detail"], "", "pass" if check["ok"] else "FAIL"))
        for key, figure in part.get("figures", {}).items():
            if not figure.get("table", True):
                continue
            met = figure.get("met")
            value = value_text(figure["value"], figure["unit"], key)
            lines.append(row(name, figure["label"], f"{value} ({figure['detail']})" if figure.get("detail") else value,
                             figure.get("target", ""), "" if met is None else "met" if met else "NOT met"))
        for note in part.get("notes", []):
            lines.append(row(name, "note", note, "", ""))
    return "\n".join(lines) + "\n"


def row(*cells: str) -> str:
    return "| " + " | ".join(str(c).replace("|", "/").replace("\n", " ") for c in cells) + " |"
