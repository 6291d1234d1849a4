"""One door out, as there is one door in: whatever wraps the model when its weights are written (torch.compile's
`_orig_mod.`, DDP's or DataParallel's `module.`, both in either order, an EMA's AveragedModel around any of them),
every file that carries weights (a checkpoint's model and EMA, vit-export's safetensors of either) holds the
plain model's names, the names timm's VisionTransformer loads strictly (safetensors #403, transformers #28041,
pytorch #122697: a compiled or DDP model's state dict written as it is cannot be loaded by the model)."""

from __future__ import annotations

import os

import pytest
import torch
from torch import nn
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

from helpers.configs import tiny_config
from vit_train.checkpoint import export_safetensors, load_weights
from vit_train.checkpoint import TrainState, checkpoint_state, restore_ema, restore_weights
from vit_train.train.run import build_ema


@pytest.fixture(scope="module")
def gloo():
    """A one-process gloo group, for DistributedDataParallel on the CPU."""
    import torch.distributed as dist

    if not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
        dist.init_process_group("gloo", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def wrapped(model: nn.Module, kind: str) -> nn.Module:
    """`model` inside the wrappers `kind` names, innermost first ("compile+ddp": DDP around a compiled model)."""
    for wrapper in kind.split("+") if kind != "none" else []:
        if wrapper == "compile":
            model = torch.compile(model)
        elif wrapper == "ddp":
            model = nn.parallel.DistributedDataParallel(model)
        else:
            model = nn.DataParallel(model)
    return model


WRAPPERS = ["none", "compile", "dataparallel", "ddp", "compile+ddp", "ddp+compile", "compile+dataparallel"]


def checkpoint_of(cfg, model: nn.Module, ema: AveragedModel) -> dict:
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    return checkpoint_state(model, optimizer, scheduler, scaler, ema, TrainState(run_id="r"), cfg, [],
                            [str(i) for i in range(10)])


@pytest.mark.parametrize("kind", WRAPPERS)
def test_every_file_with_weights_holds_the_plain_models_names(tmp_path, kind, gloo):
    cfg = tiny_config(trainer={"ema_decay": 0.9})
    torch.manual_seed(0)
    plain = cfg.model.build(10).eval()
    names = set(plain.state_dict())
    model = wrapped(plain, kind)
    assert kind == "none" or set(model.state_dict()) != names  # the wrapper does rename
    ema = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.9), use_buffers=True)
    with torch.no_grad():  # the EMA's weights differ from the model's, so a test sees which was written
        for p in ema.parameters():
            p.add_(1.0)
    ckpt = checkpoint_of(cfg, model, ema)
    assert set(ckpt["model"]) == names
    assert set(ckpt["ema"]) == {f"module.{k}" for k in names} | {"n_averaged"}
    for source, want in (("model", plain.state_dict()), ("ema", {k: v + 1 for k, v in plain.state_dict().items()})):
        path = tmp_path / f"{source}.safetensors"
        export_safetensors(ckpt, path, source)
        weights, _ = load_weights(path)
        assert set(weights) == names, source
        assert all(torch.equal(weights[k], want[k]) for k in names), source
    # and the checkpoint's weights come back into a plain model and its EMA, as the resume builds them
    again = cfg.model.build(10)
    restore_weights(ckpt, again)
    assert all(torch.equal(a, b) for a, b in zip(again.state_dict().values(), plain.state_dict().values()))
    back = build_ema(again, 0.9)
    restore_ema(ckpt, back)
    assert all(torch.equal(back.module.state_dict()[k], plain.state_dict()[k] + 1) for k in names)


PREFIXES = ["module._orig_mod.", "_orig_mod.module.", "_fsdp_wrapped_module.",  # FSDP1 of another tool
            "_checkpoint_wrapped_module."]  # activation checkpointing's wrapper


@pytest.mark.parametrize("prefix", PREFIXES)
@pytest.mark.parametrize("source", ["model", "ema"])
def test_timm_loads_an_export_of_wrapped_weights_strictly_and_computes_the_same(tmp_path, source, prefix):
    """A checkpoint whose weights carry wrapper names (written by another tool or an earlier version): the
    export holds timm's names, and timm's VisionTransformer of the same shape gives the same logits."""
    timm = pytest.importorskip("timm")
    cfg = tiny_config()
    torch.manual_seed(0)
    plain = cfg.model.build(10).eval()
    dirty = {f"{prefix}{k}": v for k, v in plain.state_dict().items()}
    ckpt = checkpoint_of(cfg, plain, AveragedModel(plain, use_buffers=True))
    ckpt["model"], ckpt["ema"] = dirty, {**{f"module.{k}": v for k, v in dirty.items()}, "n_averaged": torch.tensor(3)}
    path = tmp_path / "w.safetensors"
    export_safetensors(ckpt, path, source)
    m = cfg.model
    theirs = timm.models.vision_transformer.VisionTransformer(
        img_size=m.img_size, patch_size=m.patch_size, embed_dim=m.embed_dim, depth=m.depth, num_heads=m.num_heads, mlp_ratio=m.mlp_ratio,
        num_classes=10).eval()
    theirs.load_state_dict(load_weights(path)[0], strict=True)
    x = torch.randn(2, 3, m.img_size, m.img_size)
    torch.testing.assert_close(theirs(x), plain(x), rtol=0, atol=1e-5)


def test_an_mae_export_holds_the_encoder_under_timms_names_beside_its_decoder(tmp_path):
    """An MAE checkpoint exports the whole autoencoder (vit-eval of the file scores reconstruction with its
    decoder); its encoder.* tensors are timm's names under one prefix: a headless timm ViT loads them strictly
    and computes the encoder's features (docs/looking-inside.md)."""
    timm = pytest.importorskip("timm")
    cfg = tiny_config(objective={"name": "mae"})
    torch.manual_seed(0)
    mae = cfg.objective.build_model(cfg, 10).eval()
    ckpt = checkpoint_of(cfg, mae, AveragedModel(mae, use_buffers=True))
    export_safetensors(ckpt, tmp_path / "mae.safetensors")
    weights, _ = load_weights(tmp_path / "mae.safetensors")
    encoder = {k.removeprefix("encoder."): v for k, v in weights.items() if k.startswith("encoder.")}
    assert encoder and all(k.startswith(("encoder.", "decoder.")) for k in weights)
    m = cfg.model
    theirs = timm.models.vision_transformer.VisionTransformer(
        img_size=m.img_size, patch_size=m.patch_size, embed_dim=m.embed_dim, depth=m.depth, num_heads=m.num_heads,
        mlp_ratio=m.mlp_ratio, num_classes=0).eval()
    theirs.load_state_dict(encoder, strict=True)
