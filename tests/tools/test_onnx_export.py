"""vit-export format=onnx: one file (weights inside, no .onnx.data) with the metadata running it needs
(class names, image size, resize, mean/std) as metadata_props, and the onnxruntime snippet of
docs/looking-inside.md, run as written, gives vit-predict's probabilities."""

import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from helpers.configs import tiny_config
from vit_train.cli import commands
from vit_train.data.sources.shapes import SHAPES_STATS
from vit_train.data.sources.shapes import CLASS_NAMES
from vit_train.tools.inference import load_for_inference
from vit_train.tools.predict import predict
from vit_train.train.trainer import train

onnx = pytest.importorskip("onnx")
onnxruntime = pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")
DOC = Path(__file__).resolve().parents[2] / "docs" / "looking-inside.md"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("run")
    train(tiny_config(trainer={"max_steps": 2}), run_dir)  # 16x16 shapes, full-frame preprocessing
    return run_dir / "checkpoints" / "last.pt"


@pytest.fixture(scope="module")
def exported(checkpoint, tmp_path_factory):
    """(the command's --json result, the folder it wrote to), through the real command in this process."""
    out = tmp_path_factory.mktemp("export")
    (out / "model.onnx.data").write_bytes(b"an earlier export's weights")
    argv, sys.argv = sys.argv, ["vit-export", f"ckpt={checkpoint}", "format=onnx", f"out={out / 'model.onnx'}", "--json"]
    try:
        with pytest.MonkeyPatch.context() as patch:
            printed = []
            patch.setattr("builtins.print", lambda text, *a, **k: printed.append(text))
            commands.export_main()
    finally:
        sys.argv = argv
    return json.loads(printed[-1]), out


def test_a_small_model_is_one_file_with_its_metadata(exported, checkpoint):
    result, out = exported
    assert sorted(p.name for p in out.iterdir()) == ["model.onnx"]  # the earlier .onnx.data is gone too
    assert result["external_data"] is False and result["checked"] is True
    model = onnx.load(str(out / "model.onnx"), load_external_data=False)
    assert all(t.data_location != onnx.TensorProto.EXTERNAL for t in model.graph.initializer)
    meta = {p.key: p.value for p in model.metadata_props}
    assert json.loads(meta["class_names"]) == CLASS_NAMES
    assert (meta["img_size"], meta["resize"]) == ("16", "16")
    assert (json.loads(meta["mean"]), json.loads(meta["std"])) == (list(SHAPES_STATS[0]), list(SHAPES_STATS[1]))
    assert meta["format"] == "vit-train" and meta["weights"] == result["weights"]
    assert json.loads(meta["config"])["model"]["img_size"] == 16
    identity = json.loads(meta["identity"])  # the weights' identity travels with them (docs/finetuning.md)
    assert identity["weights"] == result["weights"] and identity["class_names"] == CLASS_NAMES
    assert identity["run_id"] == checkpoint_run_id(checkpoint) and identity["architecture"]["model.depth"] == 2
    session = onnxruntime.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    assert session.get_modelmeta().custom_metadata_map == meta


def test_the_text_names_one_file(exported):
    result, _ = exported
    assert commands.export_text(result).startswith(f"wrote {result['path']} (onnx, ")
    assert ".onnx.data" not in commands.export_text(result)
    assert ".onnx.data" in commands.export_text({**result, "external_data": True})


def test_the_docs_onnxruntime_snippet_gives_vit_predicts_probabilities(exported, checkpoint, tmp_path, monkeypatch,
                                                                      capsys):
    (snippet,) = [block for block in re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)
                  if "onnxruntime.InferenceSession" in block]
    _, out = exported
    (tmp_path / "model.onnx").symlink_to(out / "model.onnx")
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 256, (20, 27, 3), dtype=np.uint8)).save(tmp_path / "photo.jpg")  # resized, cropped
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile("\n".join(line[2:] for line in snippet.splitlines()), str(DOC), "exec"), scope)
    (expected,) = predict(load_for_inference(checkpoint), [str(tmp_path / "photo.jpg")], top_k=10)
    got = {name: float(p) for name, p in zip(scope["classes"], scope["probabilities"][0])}
    for entry in expected["top"]:
        assert got[entry["class"]] == pytest.approx(entry["probability"], abs=1e-4)
    best = expected["top"][0]
    assert capsys.readouterr().out.strip().endswith(f"{best['class']} {best['probability']:.3f}")


def checkpoint_run_id(checkpoint) -> str:
    import torch

    return torch.load(checkpoint, weights_only=True)["run_id"]
