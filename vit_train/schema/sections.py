"""The sections every run has, each a dataclass with a comment per key and its checks beside the keys:
the model, the optimiser, the schedule, the trainer, the sweep; and the bases of the three varying
groups (data, aug, objective), whose options are modules of their own (data/sources/, data/aug/,
objectives/), each a subclass with its own keys. No torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Optional

from vit_train.schema.typed import Option, Section, fraction, options, positive, require

SHAPE = "the weights have another shape"


@dataclass
class ModelConfig(Section):
    name: str = "vit_micro"  # label of the size preset, for logs only
    arch: Literal["vit", "resnet18", "resnet50"] = "vit"  # a ViT, or torchvision's ResNet (e.g. a CNN teacher)
    img_size: Optional[int] = None  # input side in pixels; null = the data set's default
    patch_size: Optional[int] = None  # patch side in pixels; null = the data set's default
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
    pretrained: Optional[str] = None  # weights to start from: a vit-train checkpoint, .safetensors or timm .pth
    reset_head: bool = False  # model.pretrained: a new classifier head (fine-tuning to other classes); else the head must fit
    reg_tokens: int = 0  # register tokens (Darcet et al. 2024), timm's reg_token; 0 = none
    init_values: Optional[float] = None  # LayerScale's initial gamma (CaiT; timm's ls1/ls2), e.g. 1e-5; null = off
    qk_norm: bool = False  # LayerNorm on each head's queries and keys (timm's attn.q_norm/k_norm)
    distilled: bool = False  # DeiT's distillation token and head (dist_token, head_dist); eval averages the heads
    trainable: Literal["all", "head"] = "all"  # head: linear probe (the rest frozen, its dropout off)
    grad_checkpointing: bool = False  # recompute each block's activations in backward (timm's name): less memory, ~1/3 more compute

    # keys a ResNet (model.arch=resnet*) has no use for
    VIT_ONLY: ClassVar[tuple[str, ...]] = (
        "embed_dim", "depth", "num_heads", "mlp_ratio", "qkv_bias", "pool", "pos_embed", "dropout", "attn_dropout",
        "drop_path", "reg_tokens", "init_values", "qk_norm", "grad_checkpointing")
    refused_on_resume: ClassVar[dict[str, str]] = {
        "arch": "the weights are another network's",
        "img_size": "the position embeddings are for another image size",
        "patch_size": SHAPE, "embed_dim": SHAPE, "depth": SHAPE, "num_heads": SHAPE, "mlp_ratio": SHAPE,
        "qkv_bias": SHAPE, "reg_tokens": SHAPE, "init_values": SHAPE, "qk_norm": SHAPE, "distilled": SHAPE,
        "pool": "the head was trained on another pooled feature",
        "pos_embed": "the position embeddings are learned in one and fixed in the other",
        "trainable": "the optimiser's state holds other parameters",
    }
    # refused keys whose new value model.pretrained cannot load the checkpoint's weights into either: the door for
    # weights (objectives/weights_in.py) refuses every architecture field that changes the function, and
    # models/pretrained.py LayerScale, QK-norm or registers that differ; img_size (positions are resized) and
    # model.distilled (head-like) load
    NO_FIT: ClassVar[tuple[str, ...]] = ("arch", "embed_dim", "patch_size", "depth", "num_heads", "mlp_ratio", "qkv_bias",
                                         "pool", "pos_embed", "init_values", "qk_norm", "reg_tokens")

    def check(self, cfg: Any) -> None:
        positive(("model.img_size", self.img_size), ("model.patch_size", self.patch_size),
                 ("model.embed_dim", self.embed_dim), ("model.depth", self.depth),
                 ("model.num_heads", self.num_heads), ("model.mlp_ratio", self.mlp_ratio))
        require(self.img_size % self.patch_size == 0, f"model.img_size ({self.img_size}) must be divisible by "
                f"model.patch_size ({self.patch_size})")
        require(self.embed_dim % self.num_heads == 0, f"model.embed_dim ({self.embed_dim}) must be divisible by "
                f"model.num_heads ({self.num_heads})")
        require(self.reg_tokens >= 0, f"model.reg_tokens must be >= 0, got {self.reg_tokens}")
        if self.arch != "vit":
            vit_only = [k for k, v in (("model.trainable=head", self.trainable == "head"),
                                       ("model.distilled", self.distilled),
                                       ("optim.layer_decay", cfg.optim.layer_decay is not None)) if v]
            require(not vit_only, f"{', '.join(vit_only)} is for ViTs; model.arch={self.arch} does not support it")
        require(self.init_values is None or self.init_values > 0, f"model.init_values must be > 0 (LayerScale's "
                f"initial scale, e.g. 1e-5) or null for none, got {self.init_values}")
        require(self.pos_embed != "sincos2d" or self.embed_dim % 4 == 0,
                f"model.pos_embed=sincos2d needs model.embed_dim divisible by 4, got {self.embed_dim}")
        for key in ("dropout", "attn_dropout", "drop_path"):
            fraction(f"model.{key}", getattr(self, key), closed=False)

    def ignored(self, cfg: Any) -> list[tuple[str, str, str]]:
        if self.arch == "vit":
            return []
        return [(key, f"model.arch={self.arch}", "ViTs (model.arch=vit)") for key in self.VIT_ONLY]


@dataclass
class OptimConfig(Section):
    name: Literal["adamw", "sgd"] = "adamw"
    lr: float = 1e-3  # peak learning rate, reached at the end of warmup
    weight_decay: float = 0.05  # decoupled (AdamW) decay; never on norms, biases, pos_embed, cls_token
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])  # AdamW
    eps: float = 1e-8  # AdamW
    momentum: float = 0.9  # SGD (Nesterov)
    clip_grad: Optional[float] = 1.0  # max global gradient norm; null = no clipping
    lr_base_batch: Optional[int] = None  # linear scaling: lr applies at this global batch; null = lr as given
    layer_decay: Optional[float] = None  # layer-wise lr decay (BEiT/MAE): block i gets lr x decay^(depth - i); null = off

    refused_on_resume: ClassVar[dict[str, str]] = {
        "name": "the optimiser's state (AdamW's two moments, SGD's momentum) does not carry over",
        "layer_decay": "the optimiser's parameter groups differ",
    }

    def check(self, cfg: Any) -> None:
        positive(("optim.lr", self.lr), ("optim.clip_grad", self.clip_grad), ("optim.lr_base_batch", self.lr_base_batch))
        require(self.layer_decay is None or 0 < self.layer_decay <= 1, f"optim.layer_decay must be in (0, 1] (e.g. "
                f"0.75 for fine-tuning) or null for off, got {self.layer_decay}")
        require(self.weight_decay >= 0, f"optim.weight_decay must be >= 0, got {self.weight_decay}")
        require(len(self.betas) == 2, f"optim.betas must have two values, got {self.betas}")
        require(self.name != "sgd" or self.momentum > 0, f"optim.momentum must be > 0 for optim=sgd (Nesterov "
                f"momentum), got {self.momentum}; e.g. 0.9")

    def ignored(self, cfg: Any) -> list[tuple[str, str, str]]:
        choice = f"optim={self.name}"
        return [("momentum", choice, "optim=sgd")] * (self.name != "sgd") + \
            [(key, choice, "optim=adamw") for key in ("betas", "eps") if self.name != "adamw"]


@dataclass
class ScheduleConfig(Section):
    name: Literal["cosine", "constant"] = "cosine"
    warmup_epochs: float = 1.0  # linear warmup length in epochs (fractions allowed)
    min_lr: float = 1e-5  # cosine: learning rate at the last step

    def check(self, cfg: Any) -> None:
        require(self.warmup_epochs >= 0, f"schedule.warmup_epochs must be >= 0, got {self.warmup_epochs}")
        require(self.name != "cosine" or 0 <= self.min_lr <= cfg.lr, f"schedule.min_lr ({self.min_lr}) must be "
                f"between 0 and optim.lr ({cfg.lr:g}{' after batch scaling' if cfg.optim.lr_base_batch else ''})")

    def ignored(self, cfg: Any) -> list[tuple[str, str, str]]:
        return [("min_lr", f"schedule={self.name}", "schedule=cosine")] * (self.name != "cosine")


@dataclass
class TrainerConfig(Section):
    epochs: int = 10  # passes over the training set
    max_steps: Optional[int] = None  # cap on optimiser steps; the schedule then ends at the cap
    accum_steps: int = 1  # micro-batches per optimiser step (data.batch_size is split into them)
    precision: Literal["auto", "bf16", "fp16", "fp32"] = "auto"  # auto: bf16 on capable GPUs, else fp32
    compile: bool = False  # torch.compile (compile_scope says what): the first step compiles, timed apart (docs/speed.md)
    compile_mode: Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"] = "default"
    compile_scope: Literal["model", "step"] = "model"  # model: its forward and backward; step: the whole training step as one graph
    compile_backend: str = "inductor"  # torch.compile's backend (timm's --torchcompile): inductor, aot_eager, eager
    peak_tflops: Optional[float] = None  # the device's peak, for MFU; null = from a table of known GPUs
    device: Literal["auto", "cuda", "cpu"] = "auto"  # auto: cuda when available
    cpu_threads: Optional[int] = None  # torch intra-op threads; null = this process's CPU share (docs/speed.md)
    eval_every: Optional[int] = None  # evaluate every N steps; null = at the end of each epoch
    limit_val_batches: Optional[int] = None  # evaluate on the first N val batches only (a partial top-1, marked so); null = all
    ckpt_every: Optional[int] = None  # also write last.pt every N steps; null = each epoch only
    log_every: int = 50  # steps between train metric logs
    progress: bool = True  # progress on stderr: a tqdm bar on a terminal, whole lines in a log (docs/outputs.md)
    keep_last: int = 2  # checkpoint versions kept (last.pt plus step_<N>.pt files); resume falls back on them
    max_bad_steps: int = 20  # consecutive steps with a non-finite loss or gradient norm before the run stops
    ema_decay: Optional[float] = None  # exponential moving average of the weights; null = off, e.g. 0.9998
    viz_every: Optional[int] = None  # figures (attention maps, confusion, ...) to TensorBoard every N evals; null = off
    strategy: Literal["ddp", "fsdp"] = "ddp"  # several processes: ddp copies the weights, fsdp shards them (FSDP2; docs/multi-gpu.md)
    fsdp_reshard_after_forward: Optional[bool] = None  # fsdp: free gathered weights after forward; null = blocks yes, root no (torchtitan)

    refused_on_resume: ClassVar[dict[str, str]] = {
        "ema_decay": "the checkpoint's EMA weights would be dropped"}  # only on -> off: an EMA may start or change decay

    def check(self, cfg: Any) -> None:
        positive(("trainer.epochs", self.epochs), ("trainer.accum_steps", self.accum_steps),
                 ("trainer.log_every", self.log_every), ("trainer.keep_last", self.keep_last),
                 ("trainer.max_bad_steps", self.max_bad_steps), ("trainer.max_steps", self.max_steps),
                 ("trainer.eval_every", self.eval_every), ("trainer.ckpt_every", self.ckpt_every),
                 ("trainer.viz_every", self.viz_every), ("trainer.cpu_threads", self.cpu_threads),
                 ("trainer.limit_val_batches", self.limit_val_batches))
        require(self.ema_decay is None or 0.0 < self.ema_decay < 1.0,
                f"trainer.ema_decay must be in (0, 1), got {self.ema_decay}")
        require(not (self.strategy == "fsdp" and self.precision == "fp16"), "trainer.strategy=fsdp does not take "
                "trainer.precision=fp16 (its GradScaler cannot see sharded gradients); use bf16 or fp32")
        require(not (self.compile and self.compile_scope == "step" and self.precision == "fp16"),
                "trainer.compile_scope=step does not take trainer.precision=fp16 (its GradScaler reads the host every "
                "step); use bf16 or fp32, or trainer.compile_scope=model")

    def ignored(self, cfg: Any) -> list[tuple[str, str, str]]:
        return [(key, "trainer.compile=false", "trainer.compile=true")
                for key in ("compile_mode", "compile_scope", "compile_backend") if not self.compile] + \
            [("fsdp_reshard_after_forward", f"trainer.strategy={self.strategy}", "trainer.strategy=fsdp")] * \
            (self.strategy != "fsdp")

    def resume_refusal(self, key: str, saved: Any) -> str | None:
        """An EMA may start (from the weights) or change its decay on resume; only switching it off is refused."""
        return super().resume_refusal(key, saved) if self.ema_decay is None else None


@dataclass
class SweepConfig(Section):
    # what a multirun job returns to the sweeper (a results.json key of the run's objective) and which way is better
    objective: str = "best_top1"  # e.g. best_top1; objective=mae: best_loss (with direction=minimize)
    direction: Literal["maximize", "minimize"] = "maximize"
    devices: Optional[int] = None  # GPUs shared by parallel jobs: each job takes a free one; null = as trainer.device

    def check(self, cfg: Any) -> None:
        positive(("sweep.devices", self.devices))
        directions = results_directions()
        require(self.objective in directions,
                f"sweep.objective must be one of {', '.join(directions)}; got {self.objective!r}")
        require(directions[self.objective] != "minimize" or self.direction == "minimize",
                f"sweep.objective={self.objective} is a loss: lower is better, so add sweep.direction=minimize")


def results_directions() -> dict[str, str]:
    """{results.json key: "maximize" or "minimize"} of every registered objective's numbers (sweep.objective's values)."""
    found: dict[str, str] = {}
    for cls in options("objective").values():
        found.update(cls.results)
    return found


@dataclass
class DataConfig(Option):
    """The data set (data=NAME): the keys every data set has. Each data set is a module of its own in
    vit_train/data/sources/ with a subclass holding its own keys."""

    group: ClassVar[str] = "data"
    input_size: ClassVar[tuple[int, int]] = (32, 4)  # (model.img_size, model.patch_size) when the config leaves them null
    encoded: ClassVar[bool] = False  # image files of any size (RandomResizedCrop, bad-image policy), not fixed-size arrays
    refused_on_resume: ClassVar[dict[str, str]] = {"name": "the classes and the head belong to another data set"}

    name: str
    batch_size: int = 128  # global batch per optimiser step, across all processes
    eval_batch_size: Optional[int] = None  # null = batch_size
    num_workers: Optional[int] = 0  # DataLoader worker processes (0 = in the training process; null = min(8, CPUs))
    pipeline: Literal["auto", "device", "loader"] = "auto"  # shapes/CIFAR on the training device; auto: on a GPU
    repeated_aug: int = 1  # repeated augmentation (DeiT): each image this many times per epoch, differently augmented

    @classmethod
    def composed(cls) -> dict[str, Any]:
        """Its section, and the model's input size it implies (`input_size`), which a model option, a recipe or
        the command line may set otherwise (they come later in the defaults list)."""
        img_size, patch_size = cls.input_size
        return {**super().composed(), "model": {"img_size": img_size, "patch_size": patch_size}}

    def check(self, cfg: Any) -> None:
        positive(("data.batch_size", self.batch_size), ("data.repeated_aug", self.repeated_aug),
                 ("data.eval_batch_size", self.eval_batch_size))
        require(self.num_workers is None or self.num_workers >= 0, f"data.num_workers must be >= 0, got {self.num_workers}")
        require(self.batch_size % cfg.trainer.accum_steps == 0, f"data.batch_size ({self.batch_size}) must be "
                f"divisible by trainer.accum_steps ({cfg.trainer.accum_steps})")


@dataclass
class AugConfig(Option):
    """The training augmentation (aug=NAME): the keys every option has (batch mixing, erasing, label
    smoothing). Each option is a module of its own in vit_train/data/aug/."""

    group: ClassVar[str] = "aug"

    name: str
    mixup_alpha: float = 0.0  # MixUp Beta(alpha, alpha) over the batch; 0 = off
    cutmix_alpha: float = 0.0  # CutMix Beta(alpha, alpha) over the batch; 0 = off
    mix_prob: float = 1.0  # probability that a batch is mixed at all (when mixup or cutmix is on)
    switch_prob: float = 0.5  # both on: probability of CutMix rather than MixUp for a batch
    random_erasing: float = 0.0  # probability of erasing a random rectangle (per-pixel noise) per image
    label_smoothing: float = 0.0  # cross-entropy label smoothing

    def check(self, cfg: Any) -> None:
        for key in ("mix_prob", "switch_prob", "random_erasing"):
            fraction(f"aug.{key}", getattr(self, key))
        require(self.mixup_alpha >= 0 and self.cutmix_alpha >= 0, f"aug.mixup_alpha and aug.cutmix_alpha must be "
                f">= 0 (0 = off), got {self.mixup_alpha} and {self.cutmix_alpha}")
        fraction("aug.label_smoothing", self.label_smoothing, closed=False)

    def ignored(self, cfg: Any) -> list[tuple[str, str, str]]:
        mix = f"aug.mixup_alpha={self.mixup_alpha}, aug.cutmix_alpha={self.cutmix_alpha}"
        return [("mix_prob", mix, "aug.mixup_alpha > 0 or aug.cutmix_alpha > 0")] * \
            (self.mixup_alpha == 0 and self.cutmix_alpha == 0) + \
            [("switch_prob", mix, "aug.mixup_alpha > 0 together with aug.cutmix_alpha > 0")] * \
            (self.mixup_alpha == 0 or self.cutmix_alpha == 0) + \
            [("label_smoothing", f"objective={cfg.objective.name} (it reads no labels)",
              "objectives trained on labels")] * (not getattr(cfg.objective, "reads_labels", True))


@dataclass
class ObjectiveConfig(Option):
    """What the training loss is (objective=NAME). Each objective is a module of its own in
    vit_train/objectives/ with a subclass holding its own keys and its contract (objectives/base.py)."""

    group: ClassVar[str] = "objective"
    metric: ClassVar[str] = ""  # the evaluation's key it is scored by (best.pt, weights=auto)
    higher_is_better: ClassVar[bool] = True
    results: ClassVar[dict[str, str]] = {}  # its numbers in results.json: {key: "maximize" or "minimize"}
    refused_on_resume: ClassVar[dict[str, str]] = {
        "name": "the weights, the loss and the best score belong to another objective"}

    name: str
