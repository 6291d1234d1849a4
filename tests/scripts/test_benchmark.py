"""scripts/benchmark.py runs and reports both models (its numbers are quoted, not asserted)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "benchmark.py"


def test_benchmark_reports_both_models_as_json(tmp_path):
    pytest.importorskip("timm")
    done = subprocess.run([sys.executable, str(SCRIPT), "--model", "vit_micro", "--img-size", "16", "--batch-size",
                           "8", "--rounds", "2", "--steps", "1", "--precision", "fp32,bf16", "--pipeline-images", "256", "--json"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["setting"]["model"] == "vit_micro" and report["setting"]["img_size"] == 16
    assert [r["precision"] for r in report["results"]] == ["fp32", "bf16"]
    for r in report["results"]:
        assert r["vit_train_images_per_s"] > 0 and r["timm_images_per_s"] > 0 and len(r["ratios"]) == 2
        assert r["ratio"] == pytest.approx(sorted(r["ratios"])[0] / 2 + sorted(r["ratios"])[1] / 2)
        flops = report["setting"]["training_gflop_per_image"] * 1e9
        assert r["vit_train_tflops"] == pytest.approx(r["vit_train_images_per_s"] * flops / 1e12)
        assert r["vit_train_mfu"] is None  # no known peak for a CPU
        assert r["mae_images_per_s"] > 0 and len(r["mae_ratios"]) == 2
        assert r["mae_over_classify"] == pytest.approx(sum(r["mae_ratios"]) / 2)
    pipes = report["pipelines"]
    assert pipes["device_images_per_s"] > 0 and pipes["loader_images_per_s"] > 0
    best = max(r["vit_train_images_per_s"] for r in report["results"])
    assert pipes["device_over_training"] == pytest.approx(pipes["device_images_per_s"] / best)
