"""The `mae` objective (objective.name=mae): masked-autoencoder pre-training (He et al. 2022), as
the loop uses it. The autoencoder, the masks and the loss are in models/mae.py, the reconstruction
figure in viz/figures.py; the interface is in objectives/__init__.py.

Its model is the autoencoder around the ViT `cfg.model` describes (the encoder, which
`model.pretrained` loads into and which a later fine-tuning takes); its score is the val
reconstruction loss on the masked patches with fixed masks, lower is better; it reads no labels.
It refuses, in one line each, what would not pre-train the encoder: a model that is no ViT, a
frozen encoder (`model.trainable=head`), a distillation head, layer-wise lr decay, batch mixing.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from vit_train.config.schema import Config
from vit_train.errors import ConfigError
from vit_train.models.mae import (EVAL_SEED, MaskSampler, MaskedAutoencoder, build_autoencoder, mae_flops_per_image,
                                  reconstruction_loss)
from vit_train.runtime.distributed import context, sum_all
from vit_train.runtime.progress import progress_iter

NAME = "mae"  # objective.name
METRIC = "loss"  # the score: val reconstruction loss (masked patches, fixed masks)
HIGHER_IS_BETTER = False
BEST_TEXT = "val reconstruction loss"  # how the closing line names the best score
READS_LABELS = False  # any folder of images will do (data/imagefolder.py)
SECTIONS = ("mae",)  # config sections of its own


class MaeObjective:
    """The `mae` training loss: called as (model, images, targets) -> (loss, None); labels are unused.

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


def check(cfg: Config) -> None:
    """Refuse (ConfigError, one line) what would not pre-train a ViT encoder, and impossible mae.* keys.

    Only an MAE run reads mae.*, so only it checks them (a classify run with mae.mask_ratio=0.75 and
    one patch per image is fine). `cfg` is a validated Config (img_size and patch_size filled, pixels).
    """
    m, a, name = cfg.model, cfg.aug, f"objective={cfg.objective.name}"
    if m.arch != "vit":
        raise ConfigError(f"{name} masks the patches of a ViT encoder; model.arch={m.arch} has none: pre-train a ViT "
                          f"(e.g. model=vit_tiny), or train the CNN with objective=classify")
    if m.trainable != "all":
        raise ConfigError(f"{name} pre-trains the encoder, which model.trainable={m.trainable} freezes (only the decoder "
                          f"would learn): use model.trainable=all; probe the encoder afterwards with "
                          f"model.trainable={m.trainable} model.pretrained=<this run>")
    if m.distilled:
        raise ConfigError(f"model.distilled adds a distillation token and head for objective=distill; {name} pre-trains "
                          f"an encoder without heads: set model.distilled=false")
    if cfg.optim.layer_decay is not None:
        raise ConfigError(f"optim.layer_decay={cfg.optim.layer_decay} is a fine-tuning rule; {name} pre-trains every "
                          f"layer at one learning rate: set optim.layer_decay=null (and use it when fine-tuning)")
    if a.mixup_alpha != 0 or a.cutmix_alpha != 0:
        raise ConfigError(f"objective.name={cfg.objective.name} reads no labels, so batch mixing has nothing to mix: "
                          f"set aug.mixup_alpha=0 and aug.cutmix_alpha=0 (got {a.mixup_alpha} and {a.cutmix_alpha})")
    _check_keys(cfg)


def _check_keys(cfg: Config) -> None:
    e, m = cfg.mae, cfg.model
    if not 0.0 < e.mask_ratio < 1.0:
        raise ConfigError(f"mae.mask_ratio must be in (0, 1), got {e.mask_ratio}")
    patches = (m.img_size // m.patch_size) ** 2
    if int(patches * (1 - e.mask_ratio)) < 1:
        raise ConfigError(f"mae.mask_ratio={e.mask_ratio} leaves no visible patch of the {patches} "
                          f"(model.img_size={m.img_size}, model.patch_size={m.patch_size}); lower it")
    for key, value in (("mae.decoder_dim", e.decoder_dim), ("mae.decoder_depth", e.decoder_depth),
                       ("mae.decoder_heads", e.decoder_heads)):
        if value <= 0:
            raise ConfigError(f"{key} must be > 0, got {value}")
    if e.decoder_dim % e.decoder_heads or e.decoder_dim % 4:
        raise ConfigError(f"mae.decoder_dim ({e.decoder_dim}) must be divisible by mae.decoder_heads "
                          f"({e.decoder_heads}) and by 4")


def build_model(cfg: Config, num_classes: int) -> MaskedAutoencoder:
    """The autoencoder: the encoder from `cfg.model` (no head: no classes) and the decoder from `cfg.mae`."""
    return build_autoencoder(cfg)


def pretrained_target(model: MaskedAutoencoder) -> nn.Module:
    """The module `model.pretrained` loads into: the encoder."""
    return model.encoder


def flops_per_image(cfg: Config, num_classes: int) -> float:
    """Training FLOPs (forward and backward) of one image: the encoder on the visible patches, the decoder on all."""
    return mae_flops_per_image(cfg)


def build_loss(cfg: Config, model: nn.Module, num_classes: int, class_names: list[str] | None = None) -> MaeObjective:
    """The loss the loop calls: (module, images, targets) -> (reconstruction loss, None)."""
    return MaeObjective(cfg)


@torch.no_grad()
def evaluate_reconstruction(model: nn.Module, loader, device: torch.device, amp_dtype: torch.dtype | None,
                            cfg: Config, progress: bool = False) -> dict[str, float]:
    """Mean reconstruction loss on the masked patches of the val set ("loss"), with fixed masks."""
    was_training = model.training
    model.eval()
    objective = MaeObjective(cfg)
    objective.masks.seed = EVAL_SEED
    totals = torch.zeros(2, device=device, dtype=torch.float64)  # loss sum over images, image count
    for images, targets in progress_iter(loader, "eval", progress):
        images = images.to(device, non_blocking=True)
        with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
            loss, _ = objective(model, images, targets)
        totals += torch.stack([loss.double() * len(images), torch.tensor(len(images), device=device).double()])
    model.train(was_training)
    sum_all(totals)
    return {"loss": (totals[0] / totals[1]).item()}


def evaluate(model: nn.Module, loader, device: torch.device, amp_dtype: torch.dtype | None, cfg: Config,
             progress: bool = False, confusion: bool = False) -> dict[str, Any]:
    """{"loss"}: the val reconstruction loss (no classes, so never a confusion matrix)."""
    return evaluate_reconstruction(model, loader, device, amp_dtype, cfg, progress)


def inference_model(cfg: Config, trained_img_size: int, num_classes: int, weights: dict) -> MaskedAutoencoder:
    """The autoencoder rebuilt from a checkpoint's `weights`, at the size it was trained at only."""
    if cfg.model.img_size != trained_img_size:
        raise ConfigError(f"model.img_size cannot change for a masked-autoencoder checkpoint (trained at "
                          f"{trained_img_size}); evaluate it at its own size")
    model = build_model(cfg, num_classes)
    model.load_state_dict(weights)
    return model


def eval_text(metrics: dict[str, float], ema: dict[str, float] | None, classes: int | None = None) -> str:
    """An evaluation in the log line: the reconstruction loss (and the EMA's)."""
    return f"val reconstruction loss {metrics['loss']:.4f}" + (f", EMA {ema['loss']:.4f}" if ema is not None else "")


def score_text(score: float) -> str:
    return f"{score:.4f}"


def data_text(num_classes: int) -> str:
    """What the run's start line says of the data's labels: none are read."""
    return "no labels (objective=mae)"
