"""Shared fixtures: tiny configs on the built-in shapes data, CPU only, outputs under tmp_path."""

from __future__ import annotations

import pytest

from vit_train.config import Config


def tiny_config(**sections) -> Config:
    """A micro ViT on a small shapes set; `sections` override keys, e.g. trainer={"max_steps": 3}."""
    plain = {
        "model": {"embed_dim": 32, "depth": 2, "num_heads": 2, "img_size": 16, "patch_size": 4},
        "data": {"train_size": 256, "val_size": 128, "batch_size": 32},
        "trainer": {"epochs": 2, "device": "cpu", "log_every": 2, "progress": False},
        "schedule": {"warmup_epochs": 0.5},
    }
    for name, values in sections.items():
        if isinstance(values, dict):
            plain.setdefault(name, {}).update(values)
        else:
            plain[name] = values
    return Config.from_dict(plain)


@pytest.fixture
def make_config():
    return tiny_config
