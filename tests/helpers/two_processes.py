"""Several processes against one (torchrun with gloo on the CPU): the runs' overrides and the oracle.

Used by test_distributed.py, test_fsdp.py and test_fsdp_faults.py: two processes train like one within
1e-5 relative per-step loss and rtol 1e-4 / atol 1e-5 on every weight (`assert_weights_close`)."""

from __future__ import annotations

import torch

TINY = ["model.embed_dim=32", "model.depth=2", "model.num_heads=2", "model.img_size=16", "data.train_size=256",
        "data.val_size=101", "data.batch_size=32", "trainer.device=cpu", "trainer.progress=false",
        "trainer.log_every=1", "trainer.accum_steps=2"]  # 8 steps per epoch; 101 val images do not split evenly


def assert_weights_close(a, b):
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-4, atol=1e-5, msg=key)
