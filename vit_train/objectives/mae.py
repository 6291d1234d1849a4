"""objective=mae: masked-autoencoder pre-training (He et al. 2022), as the loop uses it. The
autoencoder, the masks and the loss are in models/mae.py, the reconstruction figure in viz/figures.py;
the contract is objectives/base.py. Its keys (objective.mask_ratio, ...) were mae.* before.

Its model is the autoencoder around the ViT `cfg.model` describes (the encoder, which
`model.pretrained` loads into and which a later fine-tuning takes); its score is the val
reconstruction loss on the masked patches with fixed masks, lower is better; it reads no labels.
It refuses, in one line each, what would not pre-train the encoder: a model that is no ViT, a
frozen encoder (`model.trainable=head`), a distillation head, layer-wise lr decay, batch mixing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from vit_train.errors import ConfigError
from vit_train.models.families.vit import ViT
from vit_train.objectives.base import Loss, Objective
from vit_train.schema.typed import positive, require

if TYPE_CHECKING:
    import torch
    from torch import nn

    from vit_train.models.mae import MaskedAutoencoder
    from vit_train.schema.config import Config
    from vit_train.schema.sections import RunConfig

DECODER = "the decoder has another shape"


class MaskedReconstruction(Loss):
    """objective=mae's loss: called as (model, images, targets) -> (loss, None); labels are unused.

    The masks come from a MaskSampler seeded with the run's seed and the process rank; its one
    integer of state goes into the checkpoint (`state_dict`), so a resumed run masks exactly as an
    uninterrupted one.
    """

    def __init__(self, cfg: Config, rank: int = 0):
        from vit_train.models.mae import MaskSampler

        objective, img_size, patch_size = cfg.objective, cfg.model.img_size, cfg.model.patch_size
        assert isinstance(objective, Mae) and img_size is not None and patch_size is not None  # a validated config's
        self.norm_pix_loss = objective.norm_pix_loss
        self.patch_size = patch_size
        self.num_patches = (img_size // patch_size) ** 2
        self.masks = MaskSampler(cfg.seed, rank)

    def draws(self, images: torch.Tensor) -> dict[str, torch.Tensor]:
        """{"noise": (B, patches)}: the masks' noise for micro-batch `images`, from the run's mask sampler."""
        return {"noise": self.masks.noise(len(images), self.num_patches, images.device)}

    def __call__(
        self, model: nn.Module, images: torch.Tensor, targets: torch.Tensor, noise: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, None]:
        """`noise` (B, patches) from `draws`; drawn here when not given."""
        from vit_train.models.mae import reconstruction_loss

        if noise is None:
            noise = self.draws(images)["noise"]
        pred, mask = model(images, noise)
        return reconstruction_loss(pred, images, mask, self.patch_size, self.norm_pix_loss), None

    def state_dict(self) -> dict[str, int]:
        return self.masks.state_dict()

    def load_state_dict(self, state: dict[str, int] | None) -> None:
        if state is not None:
            self.masks.load_state_dict(state)


@dataclass
class Mae(Objective):
    """objective=mae: the encoder sees a random share of each image's patches, a light decoder predicts the rest."""

    title = "masked-autoencoder pre-training"
    metric = "loss"  # the score: val reconstruction loss (masked patches, fixed masks)
    higher_is_better = False
    best_text = "val reconstruction loss"
    pretrained_loads = "the encoder only; the decoder starts fresh"
    reads_labels = False  # any folder of images will do (data/sources/imagefolder.py)
    predicts = False
    results = {"best_loss": "minimize", "final_loss": "minimize", "final_ema_loss": "minimize"}
    summary_columns = {"best_loss": ("best loss", 4), "final_loss": ("final loss", 4)}
    moved_from = "mae"
    refused_on_resume = {
        **Objective.refused_on_resume,
        "decoder_dim": DECODER,
        "decoder_depth": DECODER,
        "decoder_heads": DECODER,
        "norm_pix_loss": "the decoder was trained to predict other targets, and best_loss would compare both",
        "mask_ratio": "the val reconstruction loss that picks best.pt would measure another task",
    }

    name: str = "mae"
    mask_ratio: float = 0.75  # fraction of each image's patches hidden from the encoder
    decoder_dim: int = 128  # decoder token width; divisible by 4 (2-D sin-cos positions) and by decoder_heads
    decoder_depth: int = 2  # decoder transformer blocks
    decoder_heads: int = 4  # decoder attention heads
    norm_pix_loss: bool = True  # targets: each patch's pixels normalised by its own mean and std

    def check(self, cfg: RunConfig) -> None:
        """Refuse (ConfigError, one line) what would not pre-train a ViT encoder, and impossible keys of its own.
        `cfg` is a Config whose img_size and patch_size are filled (pixels)."""
        m, a, name = cfg.model, cfg.aug, f"objective={self.name}"
        if not isinstance(m, ViT):
            raise ConfigError(
                f"{name} masks the patches of a ViT encoder; model.arch={m.arch} has none: pre-train "
                f"a ViT (e.g. model=vit_tiny), or train the CNN with objective=classify"
            )
        assert m.img_size is not None and m.patch_size is not None  # Config.validate filled them before the checks
        require(
            m.trainable == "all",
            f"{name} pre-trains the encoder, which model.trainable={m.trainable} freezes (only "
            f"the decoder would learn): use model.trainable=all; probe the encoder afterwards with "
            f"model.trainable={m.trainable} model.pretrained=<this run>",
        )
        require(
            not m.lp_epochs,
            f"model.lp_epochs (LP-FT) fine-tunes a classifier from a probe of its head; {name} pre-trains an encoder "
            f"without one: set model.lp_epochs=0 here, and give it to the fine-tuning run (model.pretrained=<this run>)",
        )
        require(
            not m.distilled,
            f"model.distilled adds a distillation token and head for objective=distill; {name} "
            f"pre-trains an encoder without heads: set model.distilled=false",
        )
        require(
            cfg.optim.layer_decay is None,
            f"optim.layer_decay={cfg.optim.layer_decay} is a fine-tuning rule; "
            f"{name} pre-trains every layer at one learning rate: set optim.layer_decay=null (and use it when "
            f"fine-tuning)",
        )
        require(
            a.mixup_alpha == 0 and a.cutmix_alpha == 0,
            f"{name} reads no labels, so batch mixing has nothing to "
            f"mix: set aug.mixup_alpha=0 and aug.cutmix_alpha=0 (got {a.mixup_alpha} and {a.cutmix_alpha})",
        )
        require(0.0 < self.mask_ratio < 1.0, f"objective.mask_ratio must be in (0, 1), got {self.mask_ratio}")
        patches = (m.img_size // m.patch_size) ** 2
        require(
            int(patches * (1 - self.mask_ratio)) >= 1,
            f"objective.mask_ratio={self.mask_ratio} leaves no visible "
            f"patch of the {patches} (model.img_size={m.img_size}, model.patch_size={m.patch_size}); lower it",
        )
        positive(
            ("objective.decoder_dim", self.decoder_dim),
            ("objective.decoder_depth", self.decoder_depth),
            ("objective.decoder_heads", self.decoder_heads),
        )
        require(
            not (self.decoder_dim % self.decoder_heads or self.decoder_dim % 4),
            f"objective.decoder_dim "
            f"({self.decoder_dim}) must be divisible by objective.decoder_heads ({self.decoder_heads}) and by 4",
        )

    def build_model(self, cfg: Config, num_classes: int) -> MaskedAutoencoder:
        """The autoencoder: the encoder from `cfg.model` (no head: no classes) and the decoder from its own keys."""
        from vit_train.models.mae import build_autoencoder

        return build_autoencoder(cfg.model, self)

    def pretrained_target(self, model: nn.Module) -> nn.Module:
        """The module `model.pretrained` loads into: the encoder (of `build_model`'s autoencoder)."""
        from vit_train.models.mae import MaskedAutoencoder

        assert isinstance(model, MaskedAutoencoder)
        return model.encoder

    def flops_per_image(self, cfg: Config, num_classes: int) -> float:
        """Training FLOPs (forward and backward) of one image: the encoder on the visible patches, the decoder on all."""
        from vit_train.models.mae import mae_flops_per_image

        return mae_flops_per_image(cfg.model, self)

    def build_loss(
        self, cfg: Config, model: nn.Module, num_classes: int, class_names: list[str] | None = None, rank: int = 0
    ) -> Loss:
        return MaskedReconstruction(cfg, rank)

    def evaluate(
        self,
        model: nn.Module,
        loader,
        device: torch.device,
        amp_dtype: torch.dtype | None,
        cfg: Config,
        progress: bool = False,
        confusion: bool = False,
    ) -> dict[str, Any]:
        """{"loss"}: the mean reconstruction loss on the masked patches of the val set, with fixed masks (no
        classes, so never a confusion matrix)."""
        import torch

        from vit_train.models.mae import EVAL_SEED
        from vit_train.runtime.distributed import context, sum_all
        from vit_train.runtime.progress import progress_iter

        was_training = model.training
        model.eval()
        loss_of = MaskedReconstruction(cfg, context().rank)
        loss_of.masks.seed = EVAL_SEED
        totals = torch.zeros(2, device=device, dtype=torch.float64)  # loss sum over images, image count
        with torch.no_grad():
            for images, targets in progress_iter(loader, "eval", progress):
                images = images.to(device, non_blocking=True)
                with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
                    loss, _ = loss_of(model, images, targets)
                totals += torch.stack([loss.double() * len(images), torch.tensor(len(images), device=device).double()])
        model.train(was_training)
        sum_all(totals)
        return {"loss": (totals[0] / totals[1]).item()}

    def inference_model(self, cfg: Config, trained_img_size: int, num_classes: int, weights: dict) -> MaskedAutoencoder:
        """The autoencoder rebuilt from a checkpoint's `weights`, at the size it was trained at only."""
        if cfg.model.img_size != trained_img_size:
            raise ConfigError(
                f"model.img_size cannot change for a masked-autoencoder checkpoint (trained at "
                f"{trained_img_size}); evaluate it at its own size"
            )
        model = self.build_model(cfg, num_classes)
        model.load_state_dict(weights)
        return model

    def eval_text(self, metrics: dict[str, float], ema: dict[str, float] | None, classes: int | None = None) -> str:
        """An evaluation in the log line: the reconstruction loss (and the EMA's)."""
        return f"val reconstruction loss {metrics['loss']:.4f}" + (
            f", EMA {ema['loss']:.4f}" if ema is not None else ""
        )

    def data_text(self, num_classes: int) -> str:
        """What the run's start line says of the data's labels: none are read."""
        return f"no labels (objective={self.name})"

    def results_of(self, best: float | None, metrics: dict[str, Any]) -> dict[str, Any]:
        return {"best_loss": best, "final_loss": metrics.get("loss"), "final_ema_loss": metrics.get("ema_loss")}

    def figures(
        self,
        model: nn.Module,
        images: torch.Tensor,
        labels: torch.Tensor,
        class_names: list[str],
        stats: tuple,
        confusion: torch.Tensor | None = None,
    ) -> dict[str, Any]:
        """Original / masked / reconstruction of the images, with the fixed val masks (viz/figures.py)."""
        from vit_train.models.mae import MaskedAutoencoder
        from vit_train.viz.figures import reconstruction_figures

        assert isinstance(model, MaskedAutoencoder)  # build_model's
        return reconstruction_figures(model, images, stats)

    @classmethod
    def report(cls, results: dict[str, Any], what: str) -> str:
        return f"{what}: masked-autoencoder reconstruction loss {results['loss']:.4f} (masked patches, fixed masks)"

    def refuse_prediction(self, what: str) -> None:
        raise ConfigError(
            f"this is a masked-autoencoder pre-training checkpoint (objective={self.name}); it {what}. "
            f"Fine-tune it first: vit-train model.pretrained=<its run directory> (docs/mae.md)"
        )
