"""model.pretrained at its seams: the ViT options that add tensors (LayerScale, QK-norm, registers) must
match between the file and the model, both ways, or the run is refused in one line naming the model.*
keys to set (ConvNeXt #51/#77, dinov3 #100: LayerScale gammas and extra tokens reported as "unexpected
keys" and dropped); other libraries' extra keys are still ignored; and what was loaded, like the
distillation teacher, is written to train.log, not only to the console."""

from __future__ import annotations

import logging

import pytest
import torch

from vit_train.errors import ConfigError
from vit_train.objectives.weights_in import load_pretrained
from vit_train.models.vit import VisionTransformer
from vit_train.train.trainer import train

SHAPE = dict(img_size=16, patch_size=4, embed_dim=32, depth=2, num_heads=2, mlp_ratio=2.0, num_classes=10)
LS = "blocks.N.ls1.gamma, blocks.N.ls2.gamma"
QK = "blocks.N.attn.q_norm.*, blocks.N.attn.k_norm.*"


def saved(tmp_path, **options) -> tuple:
    torch.manual_seed(0)
    model = VisionTransformer(**SHAPE, **options)
    torch.save(model.state_dict(), tmp_path / "w.pth")
    return model, tmp_path / "w.pth"


@pytest.mark.parametrize("file_options, model_options, said, fix", [
    ({"init_values": 1e-5}, {}, f"with model.init_values set (its {LS})", "model.init_values=1e-5"),
    ({"qk_norm": True}, {}, f"with model.qk_norm=true (its {QK})", "model.qk_norm=true"),
    ({"reg_tokens": 2}, {}, "with model.reg_tokens=2 (its reg_token)", "model.reg_tokens=2"),
    ({"reg_tokens": 4}, {"reg_tokens": 2}, "with model.reg_tokens=4 (its reg_token)", "model.reg_tokens=4"),
    ({}, {"init_values": 1e-5}, f"without model.init_values (no {LS})", "model.init_values=null"),
    ({}, {"qk_norm": True}, f"without model.qk_norm (no {QK})", "model.qk_norm=false"),
    ({}, {"reg_tokens": 2}, "without model.reg_tokens (no reg_token)", "model.reg_tokens=0"),
    ({"qk_norm": True, "reg_tokens": 2, "init_values": 0.1}, {"distilled": True},
     f"with model.init_values set (its {LS}) and with model.qk_norm=true (its {QK}) and with model.reg_tokens=2 "
     f"(its reg_token)", "model.init_values=1e-5 model.qk_norm=true model.reg_tokens=2"),
], ids=["ls", "qk", "reg", "reg-count", "no-ls", "no-qk", "no-reg", "all"])
def test_option_tensors_that_differ_are_refused_naming_the_keys(tmp_path, file_options, model_options, said, fix):
    saved(tmp_path, **file_options)
    torch.manual_seed(1)
    model = VisionTransformer(**SHAPE, **model_options)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ConfigError) as info:
        load_pretrained(model, tmp_path / "w.pth")
    assert str(info.value) == (f"model.pretrained was trained {said}; set {fix} to load it (the option-tensors must "
                               f"match, else the model is another network than the one trained)")
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())  # nothing half-loaded


@pytest.mark.parametrize("options", [{"init_values": 1e-5}, {"qk_norm": True}, {"reg_tokens": 2},
                                     {"reg_tokens": 3, "init_values": 0.5, "qk_norm": True}])
def test_matching_options_load_every_tensor_with_the_same_outputs(tmp_path, options):
    reference, path = saved(tmp_path, **options)
    other_start = {**options, "init_values": 0.25} if "init_values" in options else options
    model = VisionTransformer(**SHAPE, **other_start)  # another LayerScale start: the file's gammas replace it
    report = load_pretrained(model, path)
    assert sorted(report["loaded"]) == sorted(reference.state_dict()) and report["ignored"] == []
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        assert torch.equal(model.eval()(x), reference.eval()(x))


def test_tensors_no_forward_computes_with_are_ignored_with_a_note(tmp_path, caplog):
    """A distillation token and head, an MAE's mask token and decoder: the classic ViT's forward never
    reads them, so loading without them is the same function."""
    reference, _ = saved(tmp_path, distilled=True)
    extra = {"mask_token": torch.zeros(1, 1, 32), "decoder_embed.weight": torch.ones(16, 32),
             "decoder_pos_embed": torch.zeros(1, 17, 16)}
    torch.save(reference.state_dict() | extra, tmp_path / "x.pth")
    model = VisionTransformer(**SHAPE)
    with caplog.at_level("INFO", logger="vit_train"):
        report = load_pretrained(model, tmp_path / "x.pth")
    assert sorted(report["ignored"]) == sorted(["dist_token", "head_dist.weight", "head_dist.bias", *extra])
    assert "(a distillation token and head: model.distilled=true keeps them)" in caplog.text
    assert torch.equal(model.blocks[1].mlp.fc1.weight, reference.blocks[1].mlp.fc1.weight)


@pytest.mark.parametrize("extra, said", [
    ({"fc_norm.weight": torch.ones(32), "fc_norm.bias": torch.zeros(32)},
     "a norm after pooling (timm's fc_norm): fc_norm.weight, fc_norm.bias"),
    ({"norm_pre.weight": torch.ones(32)}, "a norm before the blocks (timm's pre_norm=True, CLIP's ln_pre): norm_pre.weight"),
    ({"fc_norm.weight": torch.ones(32), "storage_tokens": torch.zeros(1, 4, 32)},
     "a norm after pooling (timm's fc_norm): fc_norm.weight; tensors this ViT has no place for (storage_tokens)"),
], ids=["fc-norm", "pre-norm", "known-and-unknown"])
def test_tensors_the_files_network_computes_with_are_not_ignored(tmp_path, extra, said):
    """An extra tensor of another library's ViT is part of its function (pytorch #68553, timm's pre_norm):
    dropping it loads another network. Refused in one line naming the part, nothing loaded."""
    reference, _ = saved(tmp_path)
    torch.save(reference.state_dict() | extra, tmp_path / "x.pth")
    torch.manual_seed(1)
    model = VisionTransformer(**SHAPE)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ConfigError) as info:
        load_pretrained(model, tmp_path / "x.pth")
    assert str(info.value) == (f"model.pretrained: x.pth is another architecture than this model: {said}; loading it "
                               f"would compute another function, and this ViT (the classic one) cannot compute that "
                               f"network: give weights of a classic ViT (timm's VisionTransformer with its defaults, "
                               f"DeiT, torchvision, vit-train)")
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_a_probe_on_an_mae_encoder_with_other_options_is_refused_through_train(tmp_path, make_config):
    """The tester's case: MAE pre-training with LayerScale, QK-norm and registers, then a linear probe
    without them; the trained value of model.init_values comes from the checkpoint's config."""
    options = {"qk_norm": True, "init_values": 1e-4, "reg_tokens": 2}
    train(make_config(objective={"name": "mae"}, model=options, trainer={"max_steps": 1}), tmp_path / "mae")
    probe = make_config(model={"pretrained": str(tmp_path / "mae"), "trainable": "head"}, trainer={"max_steps": 1})
    with pytest.raises(ConfigError, match=r"^model.pretrained was trained with model.init_values=0.0001 .*; set "
                                          r"model.init_values=0.0001 model.qk_norm=true model.reg_tokens=2 to load it"):
        train(probe, tmp_path / "probe")
    assert not (tmp_path / "probe" / "checkpoints").exists()


# --- what the build logs reaches train.log --------------------------------------------------------

@pytest.fixture(scope="module")
def source_run(tmp_path_factory):
    from helpers.configs import tiny_config

    run_dir = tmp_path_factory.mktemp("source")
    train(tiny_config(trainer={"max_steps": 1}), run_dir)
    return run_dir / "checkpoints" / "last.pt"


@pytest.mark.parametrize("kind, line", [("pretrained", "pretrained weights from "), ("distill", "distilling from ")])
def test_what_the_build_logs_is_in_train_log_once_and_before_the_config(tmp_path, make_config, source_run, caplog,
                                                                         kind, line):
    if kind == "pretrained":
        cfg = make_config(model={"pretrained": str(source_run)}, trainer={"max_steps": 1})
    else:
        cfg = make_config(objective={"name": "distill", "teacher": str(source_run)}, trainer={"max_steps": 1})
    with caplog.at_level("INFO", logger="vit_train"):
        train(cfg, tmp_path)
    assert sum(r.getMessage().startswith(line) for r in caplog.records) == 1  # the console's once, as before
    log_lines = (tmp_path / "train.log").read_text().splitlines()
    found = [i for i, text in enumerate(log_lines) if text.split("] ", 1)[-1].startswith(line)]
    assert len(found) == 1 and log_lines[found[0]].startswith("[") and "][INFO] " in log_lines[found[0]]
    assert found[0] < next(i for i, text in enumerate(log_lines) if text.endswith("][INFO] config:"))
    assert not any(isinstance(h, logging.Handler) and type(h).__name__ == "EarlyRecords"
                   for h in logging.getLogger("vit_train").handlers)  # detached after the build


@pytest.mark.slow  # a CLI process (imports torch and Hydra): ~8 s on 2 busy cores
def test_the_command_line_refuses_other_options_in_one_line_with_exit_2(tmp_path, make_config):
    from helpers.configs import TINY
    from helpers.runs import vit_train

    train(make_config(model={"qk_norm": True}, trainer={"max_steps": 1}), tmp_path / "source")
    done = vit_train(*TINY, f"model.pretrained={tmp_path / 'source'}", f"hydra.run.dir={tmp_path / 'tuned'}",
                     cwd=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr and done.stderr.count("\n") == 1, done.stderr
    assert (f"model.pretrained was trained with model.qk_norm=true (its {QK}); set model.qk_norm=true to load it"
            in done.stderr)
    assert not (tmp_path / "tuned" / "checkpoints").exists()
