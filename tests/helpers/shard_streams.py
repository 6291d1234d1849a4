"""data=webdataset's stream as the loop reads it, on shards helpers/shards.py wrote: a `ShardStream` of a split for
one (process, worker) slot (`stream`), read back through a DataLoader as each batch's sample ids and unreadable
counts (`read_back`, `ids_of`), and a tiny training config on those shards (`run_config`). Used by
test_webdataset.py and test_webdataset_faults.py."""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader

from helpers.configs import tiny_config
from helpers.shards import sample_id
from vit_train.data.shards.index import load_index
from vit_train.data.shards.stream import ShardStream


def ids_of(image) -> torch.Tensor:
    return torch.tensor(sample_id(image))


def stream(root, split="train", rank=0, world=1, workers=1, batch=6, buffer=4, epoch=0, start=0, seed=3, tf=ids_of,
           **index_args):
    index = load_index(str(root), **index_args)
    s = ShardStream(getattr(index, split), len(index.classes), tf, split == "train", seed, batch, rank, world,
                    workers, buffer)
    s.epoch, s.start_step = epoch, start
    return s


def read_back(s, workers, batch):
    loader = DataLoader(s, batch_size=batch, num_workers=workers)
    return [(images.tolist(), problems) for images, labels, problems in loader]


def run_config(root, workers=2, **sections):
    data = {"name": "webdataset", "root": str(root), "batch_size": 8, "num_workers": workers, "shuffle_buffer": 6}
    return tiny_config(data={**data, **sections.pop("data", {})},
                       trainer={"epochs": 2, "log_every": 1, "ckpt_every": 1, **sections.pop("trainer", {})},
                       **sections)
