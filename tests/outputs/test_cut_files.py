"""A weights file cut short (an interrupted copy or download, a full disk) is named damaged, in both of
torch.save's formats, at any cut: never "cannot be read" with the reader's own words (a zip without its
central directory, a legacy file whose records end early) - docs/reliability.md's promise for every door."""

from __future__ import annotations

import pytest
import torch

from vit_train.errors import CheckpointError
from vit_train.objectives.weights_in import load_pretrained
from vit_train.models.vit import VisionTransformer
from vit_train.checkpoint import read_weights

SHAPE = dict(img_size=16, patch_size=4, embed_dim=32, depth=2, num_heads=2, num_classes=10)


@pytest.mark.parametrize("zip_format", [True, False], ids=["zip", "legacy"])
def test_a_file_cut_anywhere_is_named_damaged(tmp_path, zip_format):
    whole = tmp_path / "whole.pth"
    torch.save(VisionTransformer(**SHAPE).state_dict(), whole, _use_new_zipfile_serialization=zip_format)
    data = whole.read_bytes()
    cuts = sorted({8, 64, 500, *range(16, len(data), len(data) // 40)})
    for cut in cuts:
        path = tmp_path / f"cut{cut}.pth"
        path.write_bytes(data[:cut])
        with pytest.raises(CheckpointError) as info:
            read_weights(path)
        assert str(info.value).startswith(f"{path} is damaged (") and "get a sound copy" in str(info.value), \
            (cut, str(info.value))


def test_the_pretrained_door_says_so_too(tmp_path):
    torch.save(VisionTransformer(**SHAPE).state_dict(), tmp_path / "w.pth")
    data = (tmp_path / "w.pth").read_bytes()
    (tmp_path / "w.pth").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=r"is damaged \(it is cut short: a zip archive"):
        load_pretrained(VisionTransformer(**SHAPE), tmp_path / "w.pth")
