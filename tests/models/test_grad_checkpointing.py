"""model.grad_checkpointing: activation checkpointing per block gives the run without it, bit for bit.

The oracle is exact: dropout and drop path are on, so a recomputation that drew other masks (RNG state
not restored) or skipped a block would change the losses and the weights. Classify, MAE (encoder and
decoder blocks) and distillation run through the real loop; the 2-process DDP run through torchrun.
"""

from __future__ import annotations

import pytest
import torch

from helpers.configs import tiny_config
from helpers.files import logged, model_weights
from helpers.runs import torchrun
from vit_train.config import Config
from vit_train.models.mae import build_autoencoder
from vit_train.models.vit import Block, set_grad_checkpointing
from vit_train.train.trainer import train

NOISY = {"dropout": 0.1, "attn_dropout": 0.1, "drop_path": 0.3}  # every kind of random draw inside a block


def _runs(tmp_path, **sections):
    """Train the same config with and without grad checkpointing: (without, with) run directories."""
    dirs = []
    for on in (False, True):
        cfg = tiny_config(**{**sections, "model": {**NOISY, **sections.get("model", {}), "grad_checkpointing": on},
                             "trainer": {"max_steps": 6, "log_every": 1, **sections.get("trainer", {})}})
        train(cfg, tmp_path / str(on))
        dirs.append(tmp_path / str(on))
    return dirs


def _assert_identical(plain, checkpointed):
    losses = [e["loss"] for e in logged(plain, "train")]
    assert len(losses) == 6
    assert [e["loss"] for e in logged(checkpointed, "train")] == losses
    a, b = model_weights(plain), model_weights(checkpointed)
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


def test_each_block_runs_twice_with_it_and_once_without(monkeypatch):
    calls = []
    original = Block._forward
    monkeypatch.setattr(Block, "_forward", lambda self, x: calls.append(1) or original(self, x))
    original_first = Block._forward_first_tokens
    monkeypatch.setattr(Block, "_forward_first_tokens", lambda self, x, n: calls.append(1) or original_first(self, x, n))
    cfg = tiny_config(model={"depth": 3})
    for on, expected in ((False, 3), (True, 6)):
        torch.manual_seed(0)
        model = (Config.from_dict({**cfg.to_dict(), "model": {**cfg.to_dict()["model"],
                                                                         "grad_checkpointing": on}}).model).build(10)
        calls.clear()
        model(torch.randn(2, 3, 16, 16)).sum().backward()
        assert len(calls) == expected, on
        calls.clear()
        with torch.no_grad():  # evaluation: nothing to recompute, nothing checkpointed
            model(torch.randn(2, 3, 16, 16))
        assert len(calls) == 3


def test_the_autoencoder_checkpoints_encoder_and_decoder_blocks():
    cfg = tiny_config(model={"depth": 2, "grad_checkpointing": True},
                      objective={"name": "mae", "decoder_dim": 16, "decoder_depth": 3, "decoder_heads": 2})
    model = build_autoencoder(cfg.model, cfg.objective)
    blocks = [m for m in model.modules() if isinstance(m, Block)]
    assert len(blocks) == 5 and all(b.grad_checkpointing for b in blocks)
    assert set_grad_checkpointing(model, False) == 5 and not any(b.grad_checkpointing for b in blocks)


@pytest.mark.parametrize("pool", ["cls", "mean"])  # cls: the last block's first-tokens path is checkpointed too
def test_classify_losses_and_weights_equal_the_run_without_it(tmp_path, pool):
    _assert_identical(*_runs(tmp_path, model={"pool": pool}, trainer={"accum_steps": 2, "ema_decay": 0.9}))


def test_mae_losses_and_weights_equal_the_run_without_it(tmp_path):
    _assert_identical(*_runs(tmp_path, objective={"name": "mae", "decoder_dim": 16, "decoder_depth": 2,
                                                  "decoder_heads": 2}))


def test_distill_losses_and_weights_equal_the_run_without_it(tmp_path):
    train(tiny_config(model={"depth": 1}, trainer={"max_steps": 2}), tmp_path / "teacher")
    _assert_identical(*_runs(tmp_path, model={"distilled": True},
                             objective={"name": "distill",
                                        "teacher": str(tmp_path / "teacher" / "checkpoints" / "last.pt")}))


TINY = ["model.embed_dim=32", "model.depth=2", "model.num_heads=2", "model.img_size=16", "data.train_size=128",
        "data.val_size=64", "data.batch_size=32", "trainer.device=cpu", "trainer.progress=false",
        "trainer.log_every=1", "trainer.accum_steps=2", "trainer.max_steps=4", "model.dropout=0.1",
        "model.drop_path=0.3"]


@pytest.mark.slow  # two torchrun runs, ~20 s on 2 cores
def test_two_process_ddp_losses_and_weights_equal_the_run_without_it(tmp_path):
    for on, name in (("false", "plain"), ("true", "checkpointed")):
        done = torchrun(*TINY, f"model.grad_checkpointing={on}", f"hydra.run.dir={name}", cwd=tmp_path)
        assert done.returncode == 0, done.stdout + done.stderr
    _assert_identical_steps(tmp_path / "plain", tmp_path / "checkpointed", 4)


def _assert_identical_steps(plain, checkpointed, steps):
    losses = [e["loss"] for e in logged(plain, "train")]
    assert len(losses) == steps
    assert [e["loss"] for e in logged(checkpointed, "train")] == losses
    a, b = model_weights(plain), model_weights(checkpointed)
    for key in a:
        assert torch.equal(a[key], b[key]), key
