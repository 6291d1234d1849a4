"""vit-eval, attention maps and rollout, figures, vit-predict and vit-export."""

import json
import logging
import sys

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision.transforms import v2

from helpers.files import tb_events
from helpers.images import write_image_folder
from helpers.in_process import run_main
from helpers.runs import command
from vit_train.data.sources.shapes import SHAPES_STATS
from vit_train.errors import CheckpointError
from vit_train.data.sources.shapes import CLASS_NAMES, generate_shapes_with_masks
from vit_train.checkpoint import load_checkpoint
from vit_train.tools.export import export
from vit_train.tools.inference import auto_weights, load_for_inference
from vit_train.tools.predict import predict
from vit_train.models.vit import VisionTransformer
from vit_train.objectives.weights_in import load_pretrained
from vit_train.tools.report import evaluate_checkpoint
from vit_train.train.trainer import train
from vit_train.viz.attention import attention_rollout, pooled_attention
from vit_train.viz.figures import CELL, DPI

pytest.importorskip("matplotlib")


# --- vit-eval -------------------------------------------------------------------------------------

@pytest.mark.slow  # in the slow suite to keep `pytest` near 5 minutes on 2 cores
def test_eval_top1_equals_the_training_runs_final_top1_for_model_and_ema(trained_run, tmp_path):
    run_dir, results = trained_run
    last = run_dir / "checkpoints" / "last.pt"
    raw = evaluate_checkpoint(last, weights="model", attention_images=0, out_dir=tmp_path / "raw", progress=False)
    ema = evaluate_checkpoint(last, weights="ema", attention_images=0, out_dir=tmp_path / "ema", progress=False)
    assert (raw["weights"], ema["weights"]) == ("model", "ema")
    assert raw["top1"] == results["final_top1"] and ema["top1"] == results["final_ema_top1"]
    saved = load_checkpoint(last)  # weights=auto for last.pt reads the scores of its last evaluation
    assert saved["last_eval"] == {"step": saved["step"], "metric": "top1", "model": raw["top1"], "ema": ema["top1"]}
    confusion = torch.tensor(raw["confusion"])
    assert confusion.sum() == raw["images"] == 500
    assert 100 * confusion.trace().item() / 500 == pytest.approx(raw["top1"])
    assert list(raw["per_class"]) == CLASS_NAMES
    assert json.loads((tmp_path / "raw" / "metrics.json").read_text())["top1"] == raw["top1"]


@pytest.mark.slow  # in the slow suite to keep `pytest` near 5 minutes on 2 cores
def test_vit_eval_command_prints_the_table_and_writes_figures(trained_run):
    run_dir, results = trained_run
    done = command("eval", f"ckpt={run_dir}", "attention.images=4", "progress=false")  # a run dir: its best.pt
    assert done.returncode == 0, done.stderr
    weights = {"ema": "EMA weights", "model": "model weights"}[results["best_source"]]
    assert f"best.pt (step {results['best_step']}, {weights})" in done.stdout
    assert f"top-1 {results['best_top1']:.2f}%" in done.stdout  # the run's best number, whichever weights won
    assert "weights=auto: the " in done.stderr
    assert all(name in done.stdout for name in CLASS_NAMES)
    written = {p.name for p in (run_dir / "eval").iterdir()}
    assert written == {"metrics.json", "attention.png", "attention_heads.png", "position_similarity.png",
                       "patch_filters.png", "confusion.png"}
    attention = Image.open(run_dir / "eval" / "attention.png")
    depth = 3
    assert attention.size == (round((depth + 2) * CELL * DPI), round(4 * CELL * DPI))  # 4 images, one per row
    for name in written - {"metrics.json"}:
        pixels = torch.tensor(np.array(Image.open(run_dir / "eval" / name).convert("L")), dtype=torch.float)
        assert pixels.std() > 20, f"{name} looks blank"


@pytest.mark.slow  # in the slow suite to keep `pytest` near 5 minutes on 2 cores
@pytest.mark.parametrize("won", ["model", "ema"])
def test_auto_weights_are_the_ones_that_scored_best_for_best_pt(trained_run, tmp_path, won):
    """best.pt with best_source forced each way: weights=auto evaluates that side, in vit-eval,
    vit-predict and vit-export alike (all load through load_for_inference)."""
    run_dir, _ = trained_run
    ckpt = load_checkpoint(run_dir / "checkpoints" / "best.pt")
    ckpt["best_source"], ckpt["last_eval"] = won, None
    torch.save(ckpt, tmp_path / "best.pt")
    chosen = load_for_inference(tmp_path / "best.pt")
    model = chosen.model
    assert chosen.source == won
    expected = load_for_inference(tmp_path / "best.pt", weights=won).model
    other = load_for_inference(tmp_path / "best.pt", weights="ema" if won == "model" else "model").model
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(model(x), expected(x)) and not torch.equal(model(x), other(x))


@pytest.mark.parametrize("scores, won", [({"model": 80.0, "ema": 81.0}, "ema"), ({"model": 81.0, "ema": 80.0}, "model"),
                                         ({"model": 80.0, "ema": 80.0}, "model")])  # the model wins a tie, as in training
def test_auto_weights_for_last_pt_follow_its_last_evaluation(scores, won):
    ckpt = {"ema": {"module.x": torch.zeros(1)}, "step": 9, "best_step": 3, "best_top1": 90.0, "best_source": "ema",
            "last_eval": {"step": 9, **scores}}
    source, why = auto_weights(ckpt)
    assert source == won and f"{scores[won]:.2f}%" in why and "step 9" in why
    assert ("goes to the model" in why) == (scores["model"] == scores["ema"])  # a tie is said to be one
    assert auto_weights({**ckpt, "ema": None})[0] == "model"
    assert auto_weights({**ckpt, "last_eval": None})[0] == "ema"  # no scores at step 9: the EMA, saying so
    assert auto_weights({**ckpt, "last_eval": None, "best_step": 9, "best_source": "model"})[0] == "model"  # at the best


@pytest.mark.parametrize("scores, won", [({"model": 0.50, "ema": 0.40}, "ema"), ({"model": 0.40, "ema": 0.50}, "model"),
                                         ({"model": 0.40, "ema": 0.40}, "model")])
def test_auto_weights_for_a_masked_autoencoder_take_the_lower_loss(scores, won):
    ckpt = {"ema": {"module.x": torch.zeros(1)}, "step": 9, "best_step": 9, "best_top1": -1.0, "best_source": "model",
            "last_eval": {"step": 9, "metric": "loss", **scores}}
    source, why = auto_weights(ckpt)
    assert source == won and f"reconstruction loss {scores[won]:.4f}" in why


@pytest.mark.slow  # in the slow suite to keep `pytest` near 5 minutes on 2 cores
def test_vit_eval_and_export_take_a_run_directory(trained_run, tmp_path):
    run_dir, _ = trained_run
    done = command("export", f"ckpt={run_dir}", "format=safetensors", f"out={tmp_path / 'm.safetensors'}", "--json")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "m.safetensors").is_file()
    done = command("eval", f"ckpt={tmp_path}")
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and \
        f"ckpt={tmp_path} is a directory but no vit-train run directory (it has no checkpoints/); give " in done.stderr


@pytest.mark.parametrize("args, message", [  # in this process (tests/helpers/in_process.py): all five are fast
    ([], "missing ckpt=..."),
    (["ckpt=x.pt", "atention.images=3"], "unknown option 'atention.images'"),
    (["ckpt=x.pt", "data.rot=/x"], "did you mean 'data.root'"),
    (["ckpt=x.pt", "data=mnist"], "no data option 'mnist'"),
    (["ckpt=missing.pt"], "ckpt=missing.pt does not exist"),
])
def test_vit_eval_bad_arguments_are_one_line_and_exit_2(args, message, monkeypatch, capsys):
    from vit_train.cli.commands import eval_main

    status, _, err = run_main(eval_main, monkeypatch, capsys, *args, prog="vit-eval")
    assert status == 2 and message in err and "Traceback" not in err


@pytest.mark.slow  # in the slow suite to keep `pytest` near 5 minutes on 2 cores
def test_eval_on_data_with_other_classes_is_refused(trained_run, tmp_path):
    run_dir, _ = trained_run
    folders = tmp_path / "images"
    write_image_folder(folders, {"train": 1, "val": 1}, ("cat",), size=(8, 8), name="a.png")
    done = command("eval", f"ckpt={run_dir / 'checkpoints' / 'last.pt'}", "data=imagefolder", f"data.root={folders}",
               "data.batch_size=1")
    assert done.returncode == 2 and "classes: 10 saved, 1 in the data now" in done.stderr


# --- attention maps and rollout -------------------------------------------------------------------

def test_attention_rows_sum_to_one_and_rollout_has_one_value_per_patch():
    model = VisionTransformer(img_size=32, patch_size=8, num_classes=10, embed_dim=32, depth=3, num_heads=2).eval()
    _, maps = model.attention_maps(torch.randn(2, 3, 32, 32))
    for weights in maps:
        assert weights.shape == (2, 2, 17, 17)
        torch.testing.assert_close(weights.sum(-1), torch.ones(2, 2, 17))
    assert pooled_attention(maps, 1).shape == (2, 3, 2, 16)  # (B, layers, heads, patches)
    rollout = attention_rollout(maps, 1)
    assert rollout.shape == (2, 16) and (rollout >= 0).all()
    torch.testing.assert_close(rollout.sum(-1), torch.ones(2))


def test_rollout_of_one_layer_with_uniform_attention_is_uniform():
    uniform = torch.full((1, 2, 5, 5), 0.2)  # every token attends to all 5 equally
    torch.testing.assert_close(attention_rollout([uniform, uniform], num_prefix=1), torch.full((1, 4), 0.25))


def rollout_mass_in_box(model, count=200):
    images, _, masks = generate_shapes_with_masks(count, 32, seed=12345)  # images the model never saw
    _, maps = model.attention_maps(v2.Normalize(*SHAPES_STATS)(images.float() / 255))
    rollout = attention_rollout(maps, model.num_prefix_tokens)
    grid = model.patch_embed.grid_size
    side = 32 // grid
    per_pixel = rollout.reshape(-1, grid, grid).repeat_interleave(side, 1).repeat_interleave(side, 2) / side**2
    box = masks.any(2)[:, :, None] & masks.any(1)[:, None, :]  # each shape's bounding box
    return (per_pixel * box).sum((1, 2)), box.float().mean((1, 2))


@pytest.mark.slow  # in the slow suite to keep `pytest` near 5 minutes on 2 cores
def test_rollout_points_at_the_shape(trained_run):
    """After the short training, 35% of the rollout mass lies in the shape's bounding box, which covers
    20% of the image: 2.0x its area on average (an untrained model: 1.00x), and more than its area in
    every one of 200 new images."""
    run_dir, _ = trained_run
    model = load_for_inference(run_dir / "checkpoints" / "last.pt").model
    mass, area = rollout_mass_in_box(model)
    assert (mass / area).mean() > 1.6
    assert (mass > area).float().mean() > 0.95
    torch.manual_seed(0)
    untrained = VisionTransformer(img_size=32, patch_size=8, num_classes=10, embed_dim=64, depth=3, num_heads=4,
                                  mlp_ratio=2.0, pool="mean", pos_embed="sincos2d").eval()
    mass, area = rollout_mass_in_box(untrained)
    assert (mass / area).mean() == pytest.approx(1.0, abs=0.05)


@pytest.mark.slow  # in the slow suite to keep `pytest` near 5 minutes on 2 cores
def test_training_logs_figures_to_tensorboard_every_viz_every_evals(tmp_path, make_config):
    train(make_config(trainer={"viz_every": 2, "eval_every": 2, "max_steps": 8},
                      aug={"mixup_alpha": 0.8}), tmp_path)
    events = tb_events(tmp_path)
    assert [e.step for e in events.Images("figures/attention")] == [4, 8]  # evals at 2, 4, 6, 8: every 2nd
    assert {"figures/confusion", "figures/position_similarity", "figures/patch_filters"} <= set(events.Tags()["images"])
    assert [e.step for e in events.Images("figures/training_images")] == [0]


# --- vit-predict ----------------------------------------------------------------------------------

@pytest.mark.slow  # in the slow suite to keep `pytest` near 5 minutes on 2 cores
def test_predict_names_the_shape_in_image_files(trained_run, tmp_path):
    run_dir, _ = trained_run
    images, labels, _ = generate_shapes_with_masks(10, 32, seed=777)
    files = []
    for i, image in enumerate(images):
        files.append(str(tmp_path / f"{i}.png"))
        Image.fromarray(image.permute(1, 2, 0).numpy()).save(files[-1])
    trained = load_for_inference(run_dir / "checkpoints" / "best.pt")
    model = trained.model
    results = predict(trained, files, top_k=3)
    with torch.no_grad():
        expected = model(v2.Normalize(*SHAPES_STATS)(images.float() / 255)).softmax(1)
    for result, probs in zip(results, expected):
        assert result["top"][0]["class"] == CLASS_NAMES[probs.argmax()]  # files: the same input as the tensors
        assert result["top"][0]["probability"] == pytest.approx(probs.max().item(), abs=1e-6)
        assert len(result["top"]) == 3
    correct = sum(r["top"][0]["class"] == CLASS_NAMES[y] for r, y in zip(results, labels.tolist()))
    assert correct >= 7  # the model is ~90% accurate
    done = command("predict", f"ckpt={run_dir / 'checkpoints' / 'best.pt'}", f"images=[{files[0]},{files[1]}]", "--json")
    assert done.returncode == 0, done.stderr
    assert [r["top"][0]["class"] for r in json.loads(done.stdout)] == [r["top"][0]["class"] for r in results[:2]]
    assert done.stderr.startswith("weights=auto: ")  # said once the work succeeded
    (tmp_path / "notes.txt").write_text("not an image")
    done = command("predict", f"ckpt={run_dir}", f"images=[{files[0]},{tmp_path / 'notes.txt'}]")
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr  # the weights line is held back
    assert done.stderr.startswith("vit-predict: error: ") and "notes.txt cannot be read as an image" in done.stderr


# --- vit-export -----------------------------------------------------------------------------------

@pytest.mark.slow  # in the slow suite to keep `pytest` near 5 minutes on 2 cores
def test_safetensors_export_loads_back_with_identical_outputs_here_and_in_timm(trained_run, tmp_path):
    timm = pytest.importorskip("timm")
    run_dir, _ = trained_run
    trained = load_for_inference(run_dir / "checkpoints" / "last.pt")
    model = trained.model
    export(trained, "safetensors", tmp_path / "m.safetensors")
    x = torch.randn(4, 3, 32, 32)
    again = VisionTransformer(img_size=32, patch_size=8, num_classes=10, embed_dim=64, depth=3, num_heads=4,
                              mlp_ratio=2.0, pool="mean", pos_embed="sincos2d").eval()
    report = load_pretrained(again, tmp_path / "m.safetensors")
    assert report["reinitialised"] == [] and report["resized"] == []
    reference = timm.models.vision_transformer.VisionTransformer(
        img_size=32, patch_size=8, num_classes=10, embed_dim=64, depth=3, num_heads=4, mlp_ratio=2.0,
        global_pool="avg", class_token=False, fc_norm=False).eval()
    from safetensors.torch import load_file
    reference.load_state_dict(load_file(str(tmp_path / "m.safetensors")))
    with torch.no_grad():
        assert torch.equal(again(x), model(x))
        torch.testing.assert_close(reference(x), model(x), rtol=0, atol=1e-5)


def test_the_onnx_exporters_messages_are_hidden_unless_verbose(monkeypatch, tmp_path, capfd):
    """The exporter talks through print, warnings and its loggers ("Replaced initializer ...", which
    the command's log handler would show): none of it reaches the user unless verbose=true."""
    pytest.importorskip("onnxscript")
    from vit_train.tools import onnx_export

    def chatty_export(*args, **kwargs):
        print("[torch.onnx] Obtain model graph")
        logging.getLogger("onnx_ir.passes").warning("Replaced initializer 'val_254' with existing initializer")
        raise RuntimeError("stop here")  # the export itself is not what this test is about

    monkeypatch.setattr(torch.onnx, "export", chatty_export)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr, force=True)
    model = VisionTransformer(img_size=16, patch_size=8, num_classes=2, embed_dim=8, depth=1, num_heads=2)
    for verbose in (False, True):
        with pytest.raises(CheckpointError, match="the ONNX export failed"):
            onnx_export.export_onnx(model, 16, tmp_path / "m.onnx", verbose)
        shown = capfd.readouterr()
        assert ("Replaced initializer" in shown.err) is verbose and ("Obtain model graph" in shown.out) is verbose, shown


@pytest.mark.slow  # ~9 s on 2 cores; ONNX export also in test_vit_options.py
def test_onnx_export_matches_pytorch_at_another_batch_size(trained_run, tmp_path):
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    run_dir, _ = trained_run
    done = command("export", f"ckpt={run_dir / 'checkpoints' / 'last.pt'}", "format=onnx", f"out={tmp_path / 'm.onnx'}",
               "--json")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("{")  # the exporter's progress messages are hidden (verbose=true shows them)
    assert done.stderr.startswith("weights=auto: ") and done.stderr.count("\n") == 1, done.stderr  # nothing else
    result = json.loads(done.stdout)
    last = load_checkpoint(run_dir / "checkpoints" / "last.pt")
    assert result["checked"] and result["max_abs_diff"] < 1e-4 and result["weights"] == auto_weights(last)[0]
    import onnxruntime
    model = load_for_inference(run_dir / "checkpoints" / "last.pt").model
    session = onnxruntime.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    x = torch.randn(7, 3, 32, 32)
    got = torch.from_numpy(session.run(None, {"images": x.numpy()})[0])
    with torch.no_grad():
        torch.testing.assert_close(got, model(x), rtol=0, atol=1e-4)


def test_an_exported_safetensors_file_has_the_mode_other_outputs_have(tmp_path):
    """safetensors' writer makes the file owner-only (0600); vit-train's outputs follow the umask."""
    import os

    import torch

    from vit_train.outputs.weights import save_safetensors

    path = tmp_path / "w.safetensors"
    save_safetensors({"w": torch.ones(2)}, path, {})
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask
    assert (tmp_path / "other").open("w") and (tmp_path / "other").stat().st_mode & 0o777 == 0o666 & ~umask
