"""The typed run config: one dataclass per component, validated before any work starts.

The YAML files under configs/ compose (with Hydra, in cli.py) into a plain dict; `Config.from_dict`
checks every key and type against the dataclasses below and `validate` the combinations
(config/checks.py). Nothing here imports torch, so a bad config fails in milliseconds.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from pathlib import Path
from dataclasses import dataclass, field
from typing import Any, Literal, Optional, Union

from vit_train.config.checks import check_config
from vit_train.errors import ConfigError

@dataclass
class ModelConfig:
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


# data sets of encoded image files of any size: RandomResizedCrop, the unreadable-image policy, 224 by default
IMAGE_FILES = ("imagefolder", "webdataset", "hf")


@dataclass
class DataConfig:
    name: Literal["shapes", "cifar10", "cifar100", "imagefolder", "webdataset", "hf"] = "shapes"
    # cifar: download/read folder; imagefolder: holds train/ and val/; webdataset: holds index.json (and by
    # default the shards); hf: a save_to_disk folder or a folder of parquet files
    root: Optional[str] = None
    download: bool = True  # cifar: download (checksum-verified) when the files are absent
    batch_size: int = 128  # global batch per optimiser step, across all processes
    eval_batch_size: Optional[int] = None  # null = batch_size
    num_workers: Optional[int] = 0  # DataLoader worker processes (0 = in the training process; null = min(8, CPUs))
    train_size: int = 10000  # shapes only: number of training images
    val_size: int = 2000  # shapes only: number of validation images
    seed: int = 0  # shapes only: seed of the generated images (independent of the run's seed)
    bad_images: Literal["skip", "error"] = "skip"  # image folders: replace an unreadable image, or stop
    max_bad_fraction: float = 0.01  # skip: stop once more than this fraction of a split is unreadable
    pipeline: Literal["auto", "device", "loader"] = "auto"  # shapes/CIFAR on the training device; auto: on a GPU
    repeated_aug: int = 1  # repeated augmentation (DeiT): each image this many times per epoch, differently augmented
    train_shards: Optional[str] = None  # webdataset: brace URL or pipe: command of the train shards; null = data.root
    val_shards: Optional[str] = None  # webdataset: the same for the val shards
    shuffle_buffer: int = 5000  # webdataset: samples in each loader worker's shuffle buffer (OpenCLIP's 5000)
    image_key: str = "image"  # hf: the image column
    label_key: str = "label"  # hf: the label column (a ClassLabel gives the class names)
    train_split: str = "train"  # hf: the training split
    val_split: Optional[str] = None  # hf: the validation split; null = validation, else val, else test


@dataclass
class AugConfig:
    # none: resize/normalise only; basic: random crop (+padding) and flip; randaug, autoaug, trivial:
    # basic + RandAugment / AutoAugment / TrivialAugmentWide; deit: basic + RandAugment (with DeiT's
    # batch mixing and erasing set in aug/deit.yaml)
    name: Literal["none", "basic", "randaug", "autoaug", "trivial", "deit"] = "basic"
    crop_padding: Optional[int] = None  # small images: crop padding in pixels; null = img_size // 8
    scale_min: float = 0.08  # image folders: smallest area fraction of RandomResizedCrop
    hflip: float = 0.5  # probability of a horizontal flip
    randaug_n: int = 2  # randaug, deit: RandAugment operations per image
    randaug_m: int = 9  # randaug, deit: RandAugment magnitude, 0-30
    autoaug_policy: Optional[Literal["cifar10", "imagenet", "svhn"]] = None  # autoaug; null: cifar10 for small images
    mixup_alpha: float = 0.0  # MixUp Beta(alpha, alpha) over the batch; 0 = off
    cutmix_alpha: float = 0.0  # CutMix Beta(alpha, alpha) over the batch; 0 = off
    mix_prob: float = 1.0  # probability that a batch is mixed at all (when mixup or cutmix is on)
    switch_prob: float = 0.5  # both on: probability of CutMix rather than MixUp for a batch
    random_erasing: float = 0.0  # probability of erasing a random rectangle (per-pixel noise) per image
    label_smoothing: float = 0.0  # cross-entropy label smoothing


@dataclass
class OptimConfig:
    name: Literal["adamw", "sgd"] = "adamw"
    lr: float = 1e-3  # peak learning rate, reached at the end of warmup
    weight_decay: float = 0.05  # decoupled (AdamW) decay; never on norms, biases, pos_embed, cls_token
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])  # AdamW
    eps: float = 1e-8  # AdamW
    momentum: float = 0.9  # SGD (Nesterov)
    clip_grad: Optional[float] = 1.0  # max global gradient norm; null = no clipping
    lr_base_batch: Optional[int] = None  # linear scaling: lr applies at this global batch; null = lr as given
    layer_decay: Optional[float] = None  # layer-wise lr decay (BEiT/MAE): block i gets lr x decay^(depth - i); null = off


@dataclass
class ScheduleConfig:
    name: Literal["cosine", "constant"] = "cosine"
    warmup_epochs: float = 1.0  # linear warmup length in epochs (fractions allowed)
    min_lr: float = 1e-5  # cosine: learning rate at the last step


@dataclass
class TrainerConfig:
    epochs: int = 10  # passes over the training set
    max_steps: Optional[int] = None  # cap on optimiser steps; the schedule then ends at the cap
    accum_steps: int = 1  # micro-batches per optimiser step (data.batch_size is split into them)
    precision: Literal["auto", "bf16", "fp16", "fp32"] = "auto"  # auto: bf16 on capable GPUs, else fp32
    compile: bool = False  # torch.compile the model
    compile_mode: Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"] = "default"
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


@dataclass
class ObjectiveConfig:
    # what the training loss is (vit_train/objectives.py); pick with the config group objective=NAME
    # classify: cross-entropy on the labels; distill: DeiT's (distill.*); mae: masked-autoencoder
    # pre-training without labels (mae.*, docs/mae.md)
    name: Literal["classify", "distill", "mae"] = "classify"


@dataclass
class MaeConfig:
    # masked-autoencoder pre-training (objective.name=mae; He et al. 2022), see docs/mae.md
    mask_ratio: float = 0.75  # fraction of each image's patches hidden from the encoder
    decoder_dim: int = 128  # decoder token width; divisible by 4 (2-D sin-cos positions) and by decoder_heads
    decoder_depth: int = 2  # decoder transformer blocks
    decoder_heads: int = 4  # decoder attention heads
    norm_pix_loss: bool = True  # targets: each patch's pixels normalised by its own mean and std


@dataclass
class DistillConfig:
    # the teacher of objective=distill (DeiT, Touvron et al. 2021); see vit_train/distill.py
    teacher: Optional[str] = None  # a vit-train checkpoint or .safetensors, or a state-dict file with teacher_arch
    teacher_arch: Optional[str] = None  # null for vit-train files; else a torchvision or timm model name, e.g. resnet50
    type: Literal["hard", "soft"] = "hard"  # hard: CE on the teacher's argmax (DeiT's best); soft: KL at tau
    alpha: float = 0.5  # weight of the teacher term; the label term gets 1 - alpha (DeiT's default 0.5)
    tau: float = 1.0  # soft: softmax temperature (DeiT's default 1.0)


@dataclass
class SweepConfig:
    # what a multirun job returns to the sweeper (a results.json key) and which way is better
    objective: Literal["best_top1", "final_top1", "final_top5", "final_loss", "final_ema_top1",
                       "best_loss"] = "best_top1"  # best_loss: objective=mae's lowest val reconstruction loss
    direction: Literal["maximize", "minimize"] = "maximize"
    devices: Optional[int] = None  # GPUs shared by parallel jobs: each job takes a free one; null = as trainer.device


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    aug: AugConfig = field(default_factory=AugConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    objective: ObjectiveConfig = field(default_factory=ObjectiveConfig)
    mae: MaeConfig = field(default_factory=MaeConfig)
    distill: DistillConfig = field(default_factory=DistillConfig)
    sweep: SweepConfig = field(default_factory=SweepConfig)
    seed: int = 0  # seeds the model init, data order and augmentation
    resume: Optional[str] = None  # null, auto (newest checkpoint in the run dir), or a path
    name: str = ""  # free-form run name, for logs
    tags: list[str] = field(default_factory=list)  # free-form labels, for logs

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Config":
        """Build a validated config from plain data (Hydra's composed config, a checkpoint's)."""
        return _build(cls, data, "").validate()

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @property
    def lr(self) -> float:
        """The peak learning rate, scaled by data.batch_size / optim.lr_base_batch when that is set."""
        base = self.optim.lr_base_batch
        return self.optim.lr * (self.data.batch_size / base if base else 1.0)

    def validate(self) -> "Config":
        """Fill data-set defaults and refuse combinations that cannot run (config/checks.py); returns self."""
        check_config(self)
        return self


def config_dir() -> str:
    """configs/ inside the installed package (wheel), else at the top of the source checkout."""
    here = Path(__file__).resolve().parent.parent  # vit_train/
    for candidate in (here / "configs", here.parent / "configs"):
        if (candidate / "train.yaml").is_file():
            return str(candidate)
    raise RuntimeError(f"vit-train's configs/ folder is missing (looked in {here} and {here.parent})")


def run_dir_of(resume: str) -> Path:
    """The run directory a checkpoint or resume path belongs to (a run dir, its checkpoints/ or a file in it)."""
    path = Path(resume).expanduser()
    if path.is_file() or (path.suffix == ".pt" and not path.is_dir()):  # a directory named x.pt is a run directory
        path = path.parent
    return path.parent if path.name == "checkpoints" else path


def known_keys(cls: type = Config, prefix: str = "") -> list[str]:
    """Every dotted key of the schema, sections included (e.g. 'model', 'model.embed_dim')."""
    keys = []
    for name, tp in typing.get_type_hints(cls).items():
        keys.append(prefix + name)
        if dataclasses.is_dataclass(tp):
            keys += known_keys(tp, prefix + name + ".")
    return keys


# Names users bring from other trainers (timm, Lightning, DeiT), for "did you mean" hints.
ALIASES = {"learning_rate": "lr", "wd": "weight_decay", "grad_clip": "clip_grad", "clip_grad_norm": "clip_grad",
           "max_epochs": "epochs", "warmup": "warmup_epochs", "drop_path_rate": "drop_path", "workers": "num_workers",
           "batch": "batch_size", "patch": "patch_size", "input_size": "img_size", "global_pool": "pool",
           "mixup": "mixup_alpha", "cutmix": "cutmix_alpha", "reprob": "random_erasing", "smoothing": "label_smoothing",
           "mixup_prob": "mix_prob", "mixup_switch_prob": "switch_prob", "repeated_aug_count": "repeated_aug",
           "model_ema_decay": "ema_decay", "finetune": "pretrained"}


def unknown_key_message(key: str, valid: list[str]) -> str:
    """'unknown key X; did you mean Y?' plus the valid keys of that section."""
    section, _, leaf = key.rpartition(".")
    alias = f"{section}.{ALIASES[leaf]}" if section and leaf in ALIASES else ALIASES.get(leaf, "")
    close = [alias] if alias in valid else difflib.get_close_matches(key, valid, n=1, cutoff=0.6)
    hint = f"; did you mean '{close[0]}'?" if close else ""
    siblings = [k.rpartition(".")[2] for k in valid if k.rpartition(".")[0] == section]
    where = f"keys of '{section}'" if section else "top-level keys"
    return f"unknown config key '{key}'{hint} ({where}: {', '.join(siblings)})"


def _build(cls: type, data: Any, prefix: str) -> Any:
    if not isinstance(data, dict):
        raise ConfigError(f"'{prefix.rstrip('.') or 'config'}' must be a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for name, value in data.items():
        key = prefix + str(name)
        if name not in hints:
            raise ConfigError(unknown_key_message(key, known_keys(Config)))
        kwargs[name] = _coerce(hints[name], value, key)
    return cls(**kwargs)


def _coerce(tp: Any, value: Any, key: str) -> Any:
    """Check `value` against type `tp`; return it (ints widened to float where a float is due)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if dataclasses.is_dataclass(tp):
        return _build(tp, value, key + ".")
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _coerce(inner[0], value, key)
    if origin is Literal:
        if value not in args:
            raise ConfigError(f"{key} must be one of {', '.join(map(str, args))}; got {value!r}")
        return value
    if origin is list:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key} must be a list, got {value!r}")
        return [_coerce(args[0], v, f"{key}[{i}]") for i, v in enumerate(value)]
    if tp is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if tp in (int, bool, str) and type(value) is tp:
        return value
    names = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}
    raise ConfigError(f"{key} must be {names.get(tp, tp)}, got {value!r} ({type(value).__name__})")
