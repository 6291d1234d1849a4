"""Run under torchrun (gloo, CPU): build data=webdataset's loaders as a training process does and record, per
step, the sample ids (tests/helpers/shards.py's pixels) this rank's train batches hold, for 2 epochs, and the
val ids it evaluates; written to OUT/rank<R>.json.

    torchrun --nproc_per_node=2 tests/helpers/stream_keys.py '{"root": ..., "out": ..., "workers": 2, "batch": 4}'
"""

import json
import sys
from pathlib import Path

import torch

sys.path[0] = str(Path(__file__).resolve().parents[1])
from helpers.configs import tiny_config  # noqa: E402
from helpers.shards import sample_id  # noqa: E402

from helpers.configs import build_data  # noqa: E402
from vit_train.runtime import distributed  # noqa: E402


def ids(image) -> torch.Tensor:
    return torch.tensor(sample_id(image))


if __name__ == "__main__":
    spec = json.loads(sys.argv[1])
    cfg = tiny_config(data={"name": "webdataset", "root": spec["root"], "batch_size": spec["batch"],
                            "num_workers": spec["workers"], "shuffle_buffer": 3})
    ctx = distributed.setup("cpu")
    data = build_data(cfg, torch.device("cpu"), ctx.rank, ctx.world_size)
    data.train_loader.dataset.transform = data.val_loader.dataset.transform = ids
    epochs = []
    for epoch in range(2):
        data.train_sampler.set_epoch(epoch)
        epochs.append([batch[0].tolist() for batch in data.train_loader])
    val = [i for batch in data.val_loader for i in batch[0].tolist()]
    steps = distributed.max_all(len(epochs[0]), torch.device("cpu"))  # the processes meet: none hangs
    Path(spec["out"], f"rank{ctx.rank}.json").write_text(json.dumps({"epochs": epochs, "val": val, "steps": steps,
                                                                     "val_batches": len(data.val_loader)}))
    distributed.cleanup()
