"""Starting a pass over a loader leaves the global RNG untouched, for every data path and worker count.

Drop path, dropout, MixUp/CutMix and erasing draw from the global RNG; a resumed run restores it from the
checkpoint and then starts the loader's iterator. Had the iterator drawn its base seed from the global RNG
(a DataLoader without its own `generator`, pytorch #122697), the resumed run's draws would be shifted by one
against the uninterrupted run's: silently different weights on that path only (it was so for data=webdataset)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from helpers.configs import tiny_config
from helpers.hf_sets import hf_parquet
from helpers.images import write_noisy_colours
from helpers.shards import write_shards


def data_section(name: str, tmp_path: Path) -> dict:
    if name == "shapes":
        return {"pipeline": "loader"}
    if name == "imagefolder":
        return {"name": name, "root": str(write_noisy_colours(tmp_path / "images"))}
    if name == "webdataset":
        write_shards(tmp_path / "shards", [10, 10, 12], [6, 6])
        return {"name": name, "root": str(tmp_path / "shards"), "shuffle_buffer": 6}
    pytest.importorskip("datasets")
    return {"name": name, "root": str(hf_parquet(tmp_path / "hf"))}


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("name", ["shapes", "imagefolder", "webdataset", "hf"])
def test_a_pass_over_the_train_loader_draws_nothing_from_the_global_rng(tmp_path, name, workers):
    cfg = tiny_config(data={**data_section(name, tmp_path), "batch_size": 8, "num_workers": workers},
                      model={"drop_path": 0.1})
    data = cfg.data.build(cfg, torch.device("cpu"))
    for loader, sampler in ((data.train_loader, data.train_sampler), (data.val_loader, None)):
        if sampler is not None:
            sampler.set_epoch(0, 8, 0)  # a resumed pass, starting at the second global batch
        torch.manual_seed(0)
        before = torch.get_rng_state()
        batches = iter(loader)
        images, _ = next(batches)
        assert images.shape[0] > 0
        del batches
        assert torch.equal(torch.get_rng_state(), before), f"{name} with {workers} workers drew from the global RNG"
