"""Linear probing (MAE, He et al. 2022, appendix A.2): only the head trains, on frozen features that
a BatchNorm without affine parameters normalises."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class ProbeNorm(nn.BatchNorm1d):
    """BatchNorm1d that, in training, normalises a batch of one image by its running statistics
    (a batch of one has no variance: an epoch's last batch can be that small)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and x.shape[0] == 1:
            return F.batch_norm(x, self.running_mean, self.running_var, training=False, eps=self.eps)
        return super().forward(x)


def set_trainable(model: nn.Module, trainable: str) -> None:
    """`all`: train every parameter. `head`: a linear probe as MAE's (He et al. 2022, appendix A.2): only
    `head` (and `head_dist`) train, on features normalised by a BatchNorm without affine parameters
    (`head_norm`: its running statistics are part of the probe); the rest stays in eval mode (no dropout
    or drop path) even while training."""
    if trainable == "all":
        return
    model.requires_grad_(False)
    for name in ("head", "head_dist"):
        if getattr(model, name, None) is not None:
            getattr(model, name).requires_grad_(True)
    model.head_norm = ProbeNorm(model.norm.normalized_shape[0], affine=False, eps=1e-6)
    model.frozen_features = True
    model.train(model.training)


def set_probing(model: nn.Module, probing: bool) -> None:
    """LP-FT's stages (model.lp_epochs; Kumar et al. 2022, "Fine-Tuning can Distort Pretrained Features"):
    `probing`, only `head` (and `head_dist`) train and the rest stays in eval mode (frozen, no dropout or drop
    path), as a linear probe on the features the network has; else every parameter trains. The optimiser is built
    over every parameter first: a frozen one has no gradient, so AdamW and SGD leave it, and its moments, untouched
    (weight decay included) until it trains."""
    heads = [getattr(model, name) for name in ("head", "head_dist") if getattr(model, name, None) is not None]
    model.requires_grad_(not probing)
    for head in heads:
        head.requires_grad_(True)
    model.frozen_features = probing
    model.train(model.training)
