"""model.arch=vit: the Vision Transformer family (Dosovitskiy et al. 2021; timm's names), the default.

The network is models/vit.py's `VisionTransformer`; this module is the family as the run asks for it: its keys
(model.*, with their checks and what a resume may not change), the network built from them, its training FLOPs,
its architecture as data (from a saved config, or from the tensors of a state dict under timm's names), what FSDP
shards (each block), and the layers of layer-wise lr decay (BEiT, MAE). Importing it imports no torch: the
network's modules are imported when a network is built or read.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from vit_train.schema.sections import ModelConfig
from vit_train.schema.typed import fraction, positive, require

if TYPE_CHECKING:
    import torch
    from torch import nn

    from vit_train.schema.sections import RunConfig


SHAPE = "the weights have another shape"
BLOCK = re.compile(r"^blocks\.(\d+)\.")
# The ViT's learned tokens and positions (timm's no_weight_decay(), reg_token included: timm issue #2712).
EMBEDDINGS = ("pos_embed", "cls_token", "dist_token", "reg_token", "patch_embed.")
FLOAT32_MAX = 3.4028234663852886e38  # the largest lr the optimiser's float32 tensors hold


@dataclass
class ViT(ModelConfig):
    default = True
    reads_patches = True
    has_layers = True
    ARCHITECTURE = (
        "model.patch_size",
        "model.embed_dim",
        "model.depth",
        "model.num_heads",
        "model.mlp_ratio",
        "model.qkv_bias",
        "model.pool",
        "model.pos_embed",
        "model.reg_tokens",
        "model.init_values",
        "model.qk_norm",
        "model.distilled",
    )
    refused_on_resume = {
        **ModelConfig.refused_on_resume,
        "img_size": "the position embeddings are for another image size",
        # each reason says what differs (a head count keeps every shape: it splits the same weights otherwise)
        "patch_size": "the patch embedding's kernel has another shape",
        "embed_dim": SHAPE,
        "depth": "the network has another number of blocks",
        "num_heads": "another head count splits the same weights into other heads: another function",
        "mlp_ratio": SHAPE,
        "qkv_bias": "the attention's qkv bias would be added or dropped",
        "reg_tokens": "the register tokens are another number",
        "init_values": "LayerScale would be added or dropped",
        "qk_norm": "the query and key norms would be added or dropped",
        "distilled": "the distillation token and head would be added or dropped",
        "pool": "the head was trained on another pooled feature",
        "pos_embed": "the position embeddings are learned in one and fixed in the other",
        "trainable": "the optimiser's state holds other parameters",
        "lp_epochs": "LP-FT's change from the head alone to the whole network, and the lr schedule's restart, would move",
    }
    # refused keys whose new value model.pretrained cannot load the checkpoint's weights into either: the door for
    # weights (objectives/weights_in.py) refuses every architecture field that changes the function, and
    # models/pretrained.py LayerScale, QK-norm or registers that differ; img_size (positions are resized) and
    # model.distilled (head-like) load
    NO_FIT = (
        "arch",
        "embed_dim",
        "patch_size",
        "depth",
        "num_heads",
        "mlp_ratio",
        "qkv_bias",
        "pool",
        "pos_embed",
        "init_values",
        "qk_norm",
        "reg_tokens",
    )

    arch: str = "vit"
    embed_dim: int = 64  # token width
    depth: int = 4  # number of transformer blocks
    num_heads: int = 4  # attention heads per block; must divide embed_dim
    mlp_ratio: float = 2.0  # MLP hidden width as a multiple of embed_dim
    qkv_bias: bool = True  # bias in the query/key/value projection
    pool: Literal["cls", "mean"] = "cls"  # class token, or mean of the patch tokens
    pos_embed: Literal["learned", "sincos2d"] = "learned"  # learned, or fixed 2-D sin-cos
    dropout: float = 0.0  # dropout on embeddings and on attention/MLP outputs
    attn_dropout: float = 0.0  # dropout on attention weights
    drop_path: float = 0.0  # stochastic depth of the last block; rises linearly from 0 over depth
    reg_tokens: int = 0  # register tokens (Darcet et al. 2024), timm's reg_token; 0 = none
    init_values: float | None = None  # LayerScale's initial gamma (CaiT; timm's ls1/ls2), e.g. 1e-5; null = off
    qk_norm: bool = False  # LayerNorm on each head's queries and keys (timm's attn.q_norm/k_norm)
    distilled: bool = False  # DeiT's distillation token and head (dist_token, head_dist); eval averages the heads
    trainable: Literal["all", "head"] = "all"  # head: linear probe (the rest frozen, its dropout off)
    # LP-FT (Kumar et al. 2022): the first lp_epochs epochs train the head alone on the frozen network (as a linear
    # probe, its dropout and drop path off), then the whole network trains from that head; the lr schedule (warmup
    # included) restarts at the change. 0 = off (the whole network from the start)
    lp_epochs: float = 0.0
    # the peak lr of LP-FT's head-alone stage, scaled by optim.lr_base_batch as optim.lr is; null = optim.lr's. A probe
    # learns at a higher rate than a fine-tune (MAE's linear probe: 0.1 x batch / 256 with LARS), so one lr serves
    # one stage badly
    lp_lr: float | None = None
    grad_checkpointing: bool = (
        False  # recompute each block's activations in backward (timm's name): less memory, ~1/3 more compute
    )

    def resume_refusal(self, key: str, saved: Any) -> str | None:
        """As `refused_on_resume`, but LayerScale kept at another starting value keeps every tensor: its scales are
        the checkpoint's, so the reason is the identity every door for weights compares, not a shape."""
        if key == "init_values" and saved is not None and self.init_values is not None:
            return (
                f"the run's LayerScale started at model.init_values={saved:g}, part of the architecture every "
                f"door for weights compares"
            )
        return super().resume_refusal(key, saved)

    def check(self, cfg: RunConfig) -> None:
        super().check(cfg)
        positive(
            ("model.embed_dim", self.embed_dim),
            ("model.depth", self.depth),
            ("model.num_heads", self.num_heads),
            ("model.mlp_ratio", self.mlp_ratio),
        )
        assert (
            self.img_size is not None and self.patch_size is not None
        )  # Config.validate fills them from the data set before the checks
        require(
            self.img_size % self.patch_size == 0,
            f"model.img_size ({self.img_size}) must be divisible by model.patch_size ({self.patch_size})",
        )
        require(
            self.embed_dim % self.num_heads == 0,
            f"model.embed_dim ({self.embed_dim}) must be divisible by model.num_heads ({self.num_heads})",
        )
        require(self.reg_tokens >= 0, f"model.reg_tokens must be >= 0, got {self.reg_tokens}")
        require(
            self.init_values is None or self.init_values > 0,
            f"model.init_values must be > 0 (LayerScale's "
            f"initial scale, e.g. 1e-5) or null for none, got {self.init_values}",
        )
        require(
            self.pos_embed != "sincos2d" or self.embed_dim % 4 == 0,
            f"model.pos_embed=sincos2d needs model.embed_dim divisible by 4, got {self.embed_dim}",
        )
        for key in ("dropout", "attn_dropout", "drop_path"):
            fraction(f"model.{key}", getattr(self, key), closed=False)
        require(self.lp_epochs >= 0, f"model.lp_epochs must be >= 0 (0 = off), got {self.lp_epochs:g}")
        require(
            not self.lp_epochs or self.trainable == "all",
            f"model.lp_epochs trains the head alone first, then the whole network, which model.trainable="
            f"{self.trainable} keeps frozen: set model.trainable=all (or model.lp_epochs=0 for a linear probe)",
        )
        require(
            not self.lp_epochs or self.lp_epochs < cfg.trainer.epochs,
            f"model.lp_epochs={self.lp_epochs:g} is not shorter than trainer.epochs={cfg.trainer.epochs}: the whole "
            f"network would never train, a linear probe without the probe's BatchNorm; raise trainer.epochs or lower "
            f"model.lp_epochs (for a probe: model.trainable=head model.lp_epochs=0)",
        )
        if self.lp_lr is not None:
            require(
                0 < self.lp_lr <= FLOAT32_MAX,  # nan fails both; the optimiser's lr is a float32 on the device
                f"model.lp_lr must be a finite number > 0 (or null for optim.lr's), got {self.lp_lr:g}",
            )
            require(
                self.lp_epochs > 0,
                f"model.lp_lr={self.lp_lr:g} is the lr of LP-FT's head-alone stage, which model.lp_epochs=0 does not "
                f"have: set model.lp_epochs, or drop model.lp_lr",
            )
            low, scaled = getattr(cfg.schedule, "min_lr", 0.0), self.lp_lr * cfg.lr / cfg.optim.lr
            require(
                scaled >= low,
                f"model.lp_lr ({self.lp_lr:g}{f', {scaled:g} after batch scaling' if scaled != self.lp_lr else ''}) "
                f"must be at least schedule.min_lr ({low:g})",
            )
        t = cfg.trainer
        require(
            not (self.lp_epochs and t.compile and t.compile_scope == "step"),
            "model.lp_epochs changes which parameters train mid-run, which trainer.compile_scope=step's one graph "
            "cannot follow; use trainer.compile_scope=model",
        )

    def build(self, num_classes: int) -> nn.Module:
        """models/vit.py's VisionTransformer with these keys (`model.trainable=head`: a linear probe, models/probe.py)."""
        from vit_train.models.probe import set_trainable
        from vit_train.models.vit import VisionTransformer, set_grad_checkpointing

        assert self.img_size is not None and self.patch_size is not None  # Config.validate fills them from the data set
        model = VisionTransformer(
            img_size=self.img_size,
            patch_size=self.patch_size,
            num_classes=num_classes,
            embed_dim=self.embed_dim,
            depth=self.depth,
            num_heads=self.num_heads,
            mlp_ratio=self.mlp_ratio,
            qkv_bias=self.qkv_bias,
            pool=self.pool,
            pos_embed=self.pos_embed,
            drop_rate=self.dropout,
            attn_drop_rate=self.attn_dropout,
            drop_path_rate=self.drop_path,
            reg_tokens=self.reg_tokens,
            init_values=self.init_values,
            qk_norm=self.qk_norm,
            distilled=self.distilled,
        )
        set_trainable(model, self.trainable)
        set_grad_checkpointing(model, self.grad_checkpointing)
        return model

    def flops_per_image(self, num_classes: int) -> float:
        """Every token through every block (models/flops.py), as MFU counts them: with class-token pooling the
        loop's forward skips most of the last block for the patch tokens (~6% fewer FLOPs than this)."""
        from vit_train.models.flops import training_flops
        from vit_train.models.vit import VisionTransformer, set_grad_checkpointing

        def network() -> nn.Module:
            model = self.build(num_classes)
            set_grad_checkpointing(model, False)  # model FLOPs: the recomputation is not counted
            return model

        def forward(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
            assert isinstance(model, VisionTransformer)  # build's
            return model.forward_head(model.forward_features(x))

        assert self.img_size is not None  # Config.validate fills it from the data set
        return training_flops(network, self.img_size, forward)

    @classmethod
    def architecture(cls, saved: dict[str, Any]) -> dict[str, Any]:
        """Patch size, width, depth, heads, MLP ratio, qkv bias, pooling (and so the class token), positions,
        registers, LayerScale (on or off: the loaded gammas replace model.init_values), QK-norm, distillation token."""
        return {
            "model.arch": "vit",
            "model.patch_size": saved.get("patch_size"),
            "model.embed_dim": saved.get("embed_dim"),
            "model.depth": saved.get("depth"),
            "model.num_heads": saved.get("num_heads"),
            "model.mlp_ratio": float(saved.get("mlp_ratio", 4.0)),
            "model.qkv_bias": bool(saved.get("qkv_bias", True)),
            "model.pool": saved.get("pool", "cls"),
            "model.pos_embed": saved.get("pos_embed", "learned"),
            "model.reg_tokens": int(saved.get("reg_tokens") or 0),
            "model.init_values": saved.get("init_values") not in (None, 0),
            "model.qk_norm": bool(saved.get("qk_norm", False)),
            "model.distilled": bool(saved.get("distilled", False)),
        }

    @classmethod
    def reveals(cls, weights: dict[str, torch.Tensor]) -> dict[str, Any] | None:
        """What a state dict under timm's names shows: all but the head count (the same qkv matrix splits either
        way) and, with a class token, whether the mean was pooled; positions by their values (models/vit.py
        `position_kind`)."""
        proj = weights.get("patch_embed.proj.weight")
        if proj is None:
            return None
        from vit_train.models.vit import position_kind

        dim = proj.shape[0]
        fc1 = weights.get("blocks.0.mlp.fc1.weight")
        reg = weights.get("reg_token")
        return {
            "model.arch": "vit",
            "model.patch_size": proj.shape[-1],
            "model.embed_dim": dim,
            "model.depth": len({int(m.group(1)) for k in weights if (m := BLOCK.match(k))}),
            **({"model.mlp_ratio": fc1.shape[0] / dim} if fc1 is not None else {}),
            "model.qkv_bias": "blocks.0.attn.qkv.bias" in weights if "blocks.0.attn.qkv.weight" in weights else None,
            "model.pool": "cls" if "cls_token" in weights else "mean",
            "model.reg_tokens": reg.shape[1] if reg is not None else 0,
            **({"model.pos_embed": position_kind(weights)} if "pos_embed" in weights else {}),
            "model.init_values": any(k.endswith((".ls1.gamma", ".ls2.gamma")) for k in weights),
            "model.qk_norm": any(".attn.q_norm." in k for k in weights),
            "model.distilled": "dist_token" in weights,
        }

    def shard_units(self, model: nn.Module) -> list[nn.Module]:
        """Each transformer block (an MAE's decoder blocks too), as torchtitan and OpenCLIP shard ViTs."""
        from vit_train.models.vit import Block

        return [m for m in model.modules() if isinstance(m, Block)]

    def layers(self, model: nn.Module) -> int:
        """The embeddings, each block, the final norm and heads: depth + 2."""
        from torch import nn

        blocks = model.blocks
        assert isinstance(blocks, nn.Sequential)  # build's VisionTransformer
        return len(blocks) + 2

    def layer_of(self, name: str, layers: int) -> int:
        """0 for the patch embedding, positions and prefix tokens, i + 1 for blocks.i, the last for the final norm
        and heads (BEiT and MAE's rule; timm's group_matcher differs in one place: its final norm shares the last
        block's layer)."""
        if name.startswith(EMBEDDINGS):
            return 0
        if name.startswith("blocks."):
            return int(name.split(".")[1]) + 1
        return layers - 1

    def fit_size(self, model: nn.Module, weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Learned positions interpolated to `model`'s grid (models/pretrained.py `at_size`)."""
        from vit_train.models.pretrained import at_size

        return at_size(model, weights)
