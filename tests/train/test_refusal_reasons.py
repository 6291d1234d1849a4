"""A refused change on resume is said by what differs (the issue's kind "a message that names the wrong cause"):
a head count keeps every tensor's shape, LayerScale at another start keeps every tensor, a bias or a token is
added or dropped; only a change of width says "another shape"."""

from __future__ import annotations

import pytest

from vit_train.config import Config
from vit_train.errors import CheckpointError
from vit_train.train.resume import check_compatible

BASE = {"model": {"name": "vit_micro", "embed_dim": 32, "depth": 2, "num_heads": 2, "init_values": 1e-5}}


@pytest.mark.parametrize("key, value, why", [
    ("num_heads", 4, "another head count splits the same weights into other heads: another function"),
    ("init_values", 1e-4, "the run's LayerScale started at model.init_values=1e-05, part of the architecture every "
                          "door for weights compares"),
    ("init_values", None, "LayerScale would be added or dropped"),
    ("qkv_bias", False, "the attention's qkv bias would be added or dropped"),
    ("qk_norm", True, "the query and key norms would be added or dropped"),
    ("depth", 3, "the network has another number of blocks"),
    ("embed_dim", 64, "the weights have another shape"),
    ("patch_size", 8, "the patch embedding's kernel has another shape"),
])
def test_each_refused_architecture_change_names_what_differs(key, value, why):
    saved = Config.from_dict(BASE).to_dict()
    changed = Config.from_dict({**BASE, "model": {**BASE["model"], key: value}})
    with pytest.raises(CheckpointError) as refused:
        check_compatible({"config": saved}, changed, "last.pt")
    message = str(refused.value)
    assert f"(model.{key}: " in message and f"): {why}; resume with the saved settings" in message, message
