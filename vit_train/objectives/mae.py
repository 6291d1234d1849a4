"""The `mae` objective as the training loop uses it: the loss call and the val reconstruction loss.
The model and the loss are in mae.py, the reconstruction figure in visualize.py."""

from __future__ import annotations

import torch
from torch import nn

from vit_train.config.schema import Config
from vit_train.runtime.distributed import context, sum_all
from vit_train.models.mae import EVAL_SEED, MaskSampler, reconstruction_loss


class MaeObjective:
    """The `mae` training objective: called as (model, images, targets) -> (loss, None); labels are unused.

    The masks come from a MaskSampler seeded with the run's seed and the process rank; its one
    integer of state goes into the checkpoint (`state_dict`), so a resumed run masks exactly as an
    uninterrupted one.
    """

    def __init__(self, cfg: Config, rank: int | None = None):
        rank = context().rank if rank is None else rank
        self.norm_pix_loss = cfg.mae.norm_pix_loss
        self.patch_size = cfg.model.patch_size
        self.num_patches = (cfg.model.img_size // cfg.model.patch_size) ** 2
        self.masks = MaskSampler(cfg.seed, rank)

    def __call__(self, model: nn.Module, images: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, None]:
        noise = self.masks.noise(len(images), self.num_patches, images.device)
        pred, mask = model(images, noise)
        return reconstruction_loss(pred, images, mask, self.patch_size, self.norm_pix_loss), None

    def state_dict(self) -> dict[str, int]:
        return self.masks.state_dict()

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.masks.load_state_dict(state)


@torch.no_grad()
def evaluate_reconstruction(model: nn.Module, loader, device: torch.device, amp_dtype: torch.dtype | None,
                            cfg: Config) -> dict[str, float]:
    """Mean reconstruction loss on the masked patches of the val set ("loss"), with fixed masks."""
    was_training = model.training
    model.eval()
    objective = MaeObjective(cfg)
    objective.masks.seed = EVAL_SEED
    totals = torch.zeros(2, device=device, dtype=torch.float64)  # loss sum over images, image count
    for images, targets in loader:
        images = images.to(device, non_blocking=True)
        with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
            loss, _ = objective(model, images, targets)
        totals += torch.stack([loss.double() * len(images), torch.tensor(len(images), device=device).double()])
    model.train(was_training)
    sum_all(totals)
    return {"loss": (totals[0] / totals[1]).item()}
