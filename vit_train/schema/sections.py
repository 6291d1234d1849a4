"""The sections every run has, each a dataclass with a comment per key and its checks beside the keys: the
trainer and the sweep; and the bases of the six varying groups (model, optim, schedule, data, aug, objective),
whose options are modules of their own (models/families/, optim/, schedules/, data/sources/, data/aug/,
objectives/), each a subclass with its own keys and its part of the run. No torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Protocol

from vit_train.schema.typed import ListedOption, Option, Section, fraction, options, overridden, positive, require


@dataclass
class ModelConfig(Option):
    """The model (model.arch=FAMILY, e.g. vit, resnet18): the keys every family has. Each family is a module of its
    own in vit_train/models/families/ with a subclass holding its own keys and what the run asks of a network:

        build(num_classes)                  the network, randomly initialised
        flops_per_image(num_classes)        training FLOPs of one image (TFLOP/s, MFU); 0 = unknown
        architecture(saved), reveals(w)     its function-changing fields, from a saved config or a state dict's
                                            tensors (every door for weights compares them: models/architecture.py)
        shard_units(model)                  what FSDP shards apart (trainer.strategy=fsdp); [] = the whole model
        layer_of(name, model), layers(m)    layer-wise lr decay (optim.layer_decay): a parameter's layer, how many;
                                            None = no layers (optim.layer_decay refused)
        fit_size(model, weights)            a checkpoint's weights for this network at another image size

    model=NAME (configs/model/NAME.yaml) picks a preset of a family: its YAML lists `/schema/model/<arch>` first and
    labels the preset with model.name. The data set fills model.img_size and model.patch_size when the config
    leaves them null; a family without patches reads no patch_size."""

    group: ClassVar[str] = "model"
    chooser: ClassVar[str] = "arch"
    # the architecture fields a refusal lists, in its order (besides model.arch): a family's ARCHITECTURE
    ARCHITECTURE: ClassVar[tuple[str, ...]] = ()
    # refused keys whose new value model.pretrained cannot load the checkpoint's weights into either (train/resume.py)
    NO_FIT: ClassVar[tuple[str, ...]] = ("arch",)
    refused_on_resume: ClassVar[dict[str, str]] = {"arch": "the weights are another network's"}
    has_layers: ClassVar[bool] = False  # layer_of/layers are defined (optim.layer_decay applies)
    reads_patches: ClassVar[bool] = False  # model.patch_size is read

    name: str = "vit_micro"  # label of the size preset (model=NAME), for logs only
    arch: str = ""  # the family (models/families/): vit, resnet18, resnet50, or a plugin's; each family's class sets it
    img_size: int | None = None  # input side in pixels; null = the data set's default
    patch_size: int | None = None  # patch side in pixels (families with patches); null = the data set's default
    pretrained: str | None = None  # weights to start from: a vit-train checkpoint, .safetensors or timm .pth
    reset_head: bool = (
        False  # model.pretrained: a new classifier head (fine-tuning to other classes); else the head must fit
    )

    def check(self, cfg: RunConfig) -> None:
        positive(("model.img_size", self.img_size), ("model.patch_size", self.patch_size))
        require(
            cfg.optim.layer_decay is None or self.has_layers,
            f"optim.layer_decay is for networks of "
            f"numbered layers; model.arch={self.arch} has none: set optim.layer_decay=null",
        )

    def resume_refusal(self, key: str, saved: Any) -> str | None:
        """The family's own reason (`refused_on_resume`); else, for one of its ARCHITECTURE fields (a family of your
        own lists only those), that the checkpoint's weights are another network's, as every other door says."""
        own = super().resume_refusal(key, saved)
        if own is None and f"model.{key}" in type(self).ARCHITECTURE:
            return f"model.{key} is an architecture field of model.arch={self.arch}: the checkpoint's weights are another network's"
        return own

    @classmethod
    def no_fit(cls, key: str) -> bool:
        """Whether model.pretrained could not load a checkpoint's weights into this family with `key` changed either:
        NO_FIT, and an ARCHITECTURE field the family gives no reason of its own for (`resume_refusal`)."""
        return key in cls.NO_FIT or (f"model.{key}" in cls.ARCHITECTURE and key not in cls.refused_on_resume)

    def ignored(self, cfg: RunConfig) -> list[tuple[str, str, str]]:
        """patch_size, for a family without patches, when it is not the data set's (which fills it for every model)."""
        if self.reads_patches or self.patch_size in (None, type(cfg.data).input_size[1]):
            return []
        return [("patch_size", f"model.arch={self.arch}", "families with patches (model.arch=vit)")]

    def build(self, num_classes: int) -> Any:
        """The network with `num_classes` outputs (0: none, a feature extractor), randomly initialised: an nn.Module
        taking (B, 3, img_size, img_size) float images."""
        raise NotImplementedError

    def flops_per_image(self, num_classes: int) -> float:
        """Training FLOPs (forward and backward) of one image; 0: unknown (no TFLOP/s or MFU is logged)."""
        return 0.0

    @classmethod
    def architecture(cls, saved: dict[str, Any]) -> dict[str, Any]:
        """The function-changing fields of a saved config's model section (plain data), under the user's keys."""
        return {"model.arch": saved.get("arch", cls.arch)}

    @classmethod
    def reveals(cls, weights: dict[str, Any]) -> dict[str, Any] | None:
        """What a state dict's tensors show of this family's architecture; None when they are not its."""
        return None

    def shard_units(self, model: Any) -> list[Any]:
        """The submodules FSDP shards one by one (each gathered alone), inside out; [] = the model whole."""
        return []

    def layer_of(self, name: str, layers: int) -> int:
        """A parameter's layer for layer-wise lr decay: 0 (the input side) to `layers` - 1 (the head)."""
        raise NotImplementedError

    def layers(self, model: Any) -> int:
        """How many layers `layer_of` counts in `model`."""
        raise NotImplementedError

    def fit_size(self, model: Any, weights: dict[str, Any]) -> dict[str, Any]:
        """`weights` (a state dict for this family at another model.img_size) for `model`: as they are by default."""
        return weights

    @classmethod
    def unimplemented(cls) -> list[str]:
        return [] if overridden(cls, ModelConfig, "build") else ["build"]

    @classmethod
    def composed(cls) -> dict[str, Any]:
        """Its section without the input size, which the data set's node (before it in the defaults list) puts in."""
        section = super().composed()["model"]
        return {"model": {k: v for k, v in section.items() if k not in ("img_size", "patch_size")}}


@dataclass
class OptimConfig(Option):
    """The optimiser (optim=NAME): the keys every optimiser has. Each optimiser is a module of its own in
    vit_train/optim/ with a subclass holding its own keys and

        build(groups, lr, device, capturable)    torch's optimiser over the parameter groups (fused where it can;
                                                 `capturable`: the multi-tensor form a compiled step takes)
        update(params, grads, state, group, lr)  its functional update (torch's), inside a compiled step
        init_state(optimizer)                    the per-parameter state its first step would make
        moments                                  tensors of state per parameter (the checkpoint's size)"""

    group: ClassVar[str] = "optim"
    moments: ClassVar[int] = 0
    refused_on_resume: ClassVar[dict[str, str]] = {
        "name": "the optimiser's state (AdamW's two moments, SGD's momentum) does not carry over",
        "layer_decay": "the optimiser's parameter groups differ",
    }

    name: str
    lr: float = 1e-3  # peak learning rate, reached at the end of warmup
    weight_decay: float = 0.05  # never on norms, biases, pos_embed, cls_token
    clip_grad: float | None = 1.0  # max global gradient norm; null = no clipping
    lr_base_batch: int | None = None  # linear scaling: lr applies at this global batch; null = lr as given
    layer_decay: float | None = None  # layer-wise lr decay (BEiT/MAE): block i gets lr x decay^(depth - i); null = off

    def check(self, cfg: RunConfig) -> None:
        positive(
            ("optim.lr", self.lr), ("optim.clip_grad", self.clip_grad), ("optim.lr_base_batch", self.lr_base_batch)
        )
        require(
            self.layer_decay is None or 0 < self.layer_decay <= 1,
            f"optim.layer_decay must be in (0, 1] (e.g. 0.75 for fine-tuning) or null for off, got {self.layer_decay}",
        )
        require(self.weight_decay >= 0, f"optim.weight_decay must be >= 0, got {self.weight_decay}")

    def build(self, groups: list[dict], lr: float, device: Any, capturable: bool = False) -> Any:
        """torch's optimiser over `groups` (each with its "lr"), peak rate `lr`, for parameters on `device`."""
        raise NotImplementedError

    def update(self, params: list, grads: list, state: list[dict], group: dict, lr: Any) -> None:
        """One update of `params` by `grads` (lists alike) with their `state` and their `group`'s hyperparameters at
        learning rate `lr` (a device tensor), as torch's step does: traced into a compiled step."""
        raise NotImplementedError

    def init_state(self, optimizer: Any) -> None:
        """The per-parameter state `optimizer`'s first step would make, made now (a compiled step reads it)."""
        raise NotImplementedError

    @classmethod
    def unimplemented(cls) -> list[str]:
        missing = [] if cls.moments else ["moments"]
        return missing + [m for m in ("build", "update", "init_state") if not overridden(cls, OptimConfig, m)]


@dataclass
class ScheduleConfig(Option):
    """The learning-rate schedule (schedule=NAME): the keys every schedule has. Each schedule is a module of its own
    in vit_train/schedules/ with a subclass holding its own keys and `factor`: the multiplier of the peak lr at a
    step, a pure function of the step (a resumed run rebuilds it at its step; a compiled step writes it into a
    device tensor before each step)."""

    group: ClassVar[str] = "schedule"

    name: str
    warmup_epochs: float = 1.0  # linear warmup length in epochs (fractions allowed)

    def check(self, cfg: RunConfig) -> None:
        require(self.warmup_epochs >= 0, f"schedule.warmup_epochs must be >= 0, got {self.warmup_epochs}")

    def factor(self, step: int, warmup_steps: int, total_steps: int, lr: float) -> float:
        """The multiplier of the peak rate `lr` for optimiser step `step` (0-based) of `total_steps`, after
        `warmup_steps` of linear warmup: (step + 1) / warmup_steps during it."""
        raise NotImplementedError

    @classmethod
    def unimplemented(cls) -> list[str]:
        return [] if overridden(cls, ScheduleConfig, "factor") else ["factor"]


@dataclass
class TrainerConfig(Section):
    epochs: int = 10  # passes over the training set
    max_steps: int | None = None  # cap on optimiser steps; the schedule then ends at the cap
    accum_steps: int = 1  # micro-batches per optimiser step (data.batch_size is split into them)
    precision: Literal["auto", "bf16", "fp16", "fp32"] = "auto"  # auto: bf16 on capable GPUs, else fp32
    compile: bool = (
        False  # torch.compile (compile_scope says what): the first step compiles, timed apart (docs/speed.md)
    )
    compile_mode: Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"] = "default"
    compile_scope: Literal["model", "step"] = (
        "model"  # model: its forward and backward; step: the whole training step as one graph
    )
    compile_backend: str = "inductor"  # torch.compile's backend (timm's --torchcompile): inductor, aot_eager, eager
    peak_tflops: float | None = None  # the device's peak, for MFU; null = from a table of known GPUs
    device: Literal["auto", "cuda", "cpu"] = "auto"  # auto: cuda when available
    cpu_threads: int | None = None  # torch intra-op threads; null = this process's CPU share (docs/speed.md)
    eval_every: int | None = None  # evaluate every N steps; null = at the end of each epoch
    limit_val_batches: int | None = (
        None  # evaluate on the first N val batches only (a partial top-1, marked so); null = all
    )
    ckpt_every: int | None = None  # also write last.pt every N steps; null = each epoch only
    log_every: int = 50  # steps between train metric logs
    progress: bool = True  # progress on stderr: a tqdm bar on a terminal, whole lines in a log (docs/outputs.md)
    keep_last: int = 2  # checkpoint versions kept (last.pt plus step_<N>.pt files); resume falls back on them
    max_bad_steps: int = 20  # consecutive steps with a non-finite loss or gradient norm before the run stops
    ema_decay: float | None = None  # exponential moving average of the weights; null = off, e.g. 0.9998
    viz_every: int | None = None  # figures (attention maps, confusion, ...) to TensorBoard every N evals; null = off
    strategy: Literal["ddp", "fsdp"] = (
        "ddp"  # several processes: ddp copies the weights, fsdp shards them (FSDP2; docs/multi-gpu.md)
    )
    fsdp_reshard_after_forward: bool | None = (
        None  # fsdp: free gathered weights after forward; null = blocks yes, root no (torchtitan)
    )

    refused_on_resume: ClassVar[dict[str, str]] = {
        "ema_decay": "the checkpoint's EMA weights would be dropped"
    }  # only on -> off: an EMA may start or change decay

    def check(self, cfg: RunConfig) -> None:
        positive(
            ("trainer.epochs", self.epochs),
            ("trainer.accum_steps", self.accum_steps),
            ("trainer.log_every", self.log_every),
            ("trainer.keep_last", self.keep_last),
            ("trainer.max_bad_steps", self.max_bad_steps),
            ("trainer.max_steps", self.max_steps),
            ("trainer.eval_every", self.eval_every),
            ("trainer.ckpt_every", self.ckpt_every),
            ("trainer.viz_every", self.viz_every),
            ("trainer.cpu_threads", self.cpu_threads),
            ("trainer.limit_val_batches", self.limit_val_batches),
        )
        require(
            self.viz_every is None or "tensorboard" in cfg.logger,
            "trainer.viz_every draws its figures in TensorBoard, which logger= leaves out: add tensorboard to the "
            "list (logger=[tensorboard,...]) or set trainer.viz_every=null",
        )
        require(
            self.ema_decay is None or 0.0 < self.ema_decay < 1.0,
            f"trainer.ema_decay must be in (0, 1), got {self.ema_decay}",
        )
        require(
            not (self.strategy == "fsdp" and self.precision == "fp16"),
            "trainer.strategy=fsdp does not take "
            "trainer.precision=fp16 (its GradScaler cannot see sharded gradients); use bf16 or fp32",
        )
        require(
            not (self.compile and self.compile_scope == "step" and self.precision == "fp16"),
            "trainer.compile_scope=step does not take trainer.precision=fp16 (its GradScaler reads the host every "
            "step); use bf16 or fp32, or trainer.compile_scope=model",
        )

    def ignored(self, cfg: RunConfig) -> list[tuple[str, str, str]]:
        return [
            (key, "trainer.compile=false", "trainer.compile=true")
            for key in ("compile_mode", "compile_scope", "compile_backend")
            if not self.compile
        ] + [("fsdp_reshard_after_forward", f"trainer.strategy={self.strategy}", "trainer.strategy=fsdp")] * (
            self.strategy != "fsdp"
        )

    def resume_refusal(self, key: str, saved: Any) -> str | None:
        """An EMA may start (from the weights) or change its decay on resume; only switching it off is refused."""
        return super().resume_refusal(key, saved) if self.ema_decay is None else None


@dataclass
class SweepConfig(Section):
    # what a multirun job returns to the sweeper (a results.json key of the run's objective) and which way is better
    objective: str = "best_top1"  # e.g. best_top1; objective=mae: best_loss (with direction=minimize)
    direction: Literal["maximize", "minimize"] = "maximize"
    devices: int | None = None  # GPUs shared by parallel jobs: each job takes a free one; null = as trainer.device

    def check(self, cfg: RunConfig) -> None:
        positive(("sweep.devices", self.devices))
        directions = results_directions()
        require(
            self.objective in directions,
            f"sweep.objective must be one of {', '.join(directions)}; got {self.objective!r}",
        )
        require(
            directions[self.objective] != "minimize" or self.direction == "minimize",
            f"sweep.objective={self.objective} is a loss: lower is better, so add sweep.direction=minimize",
        )


def results_directions() -> dict[str, str]:
    """{results.json key: "maximize" or "minimize"} of every registered objective's numbers (sweep.objective's values)."""
    found: dict[str, str] = {}
    for cls in options("objective").values():
        assert issubclass(cls, ObjectiveConfig)  # the objective group's options subclass its base
        found.update(cls.results)
    return found


@dataclass
class DataConfig(Option):
    """The data set (data=NAME): the keys every data set has. Each data set is a module of its own in
    vit_train/data/sources/ with a subclass holding its own keys."""

    group: ClassVar[str] = "data"
    input_size: ClassVar[tuple[int, int]] = (
        32,
        4,
    )  # (model.img_size, model.patch_size) when the config leaves them null
    encoded: ClassVar[bool] = (
        False  # image files of any size (RandomResizedCrop, bad-image policy), not fixed-size arrays
    )
    refused_on_resume: ClassVar[dict[str, str]] = {"name": "the classes and the head belong to another data set"}

    name: str
    batch_size: int = 128  # global batch per optimiser step, across all processes
    eval_batch_size: int | None = None  # null = batch_size
    num_workers: int | None = 0  # DataLoader worker processes (0 = in the training process; null = min(8, CPUs))
    pipeline: Literal["auto", "device", "loader"] = "auto"  # shapes/CIFAR on the training device; auto: on a GPU
    repeated_aug: int = 1  # repeated augmentation (DeiT): each image this many times per epoch, differently augmented

    @classmethod
    def composed(cls) -> dict[str, Any]:
        """Its section, and the model's input size it implies (`input_size`), which a model option, a recipe or
        the command line may set otherwise (they come later in the defaults list)."""
        img_size, patch_size = cls.input_size
        return {**super().composed(), "model": {"img_size": img_size, "patch_size": patch_size}}

    def check(self, cfg: RunConfig) -> None:
        positive(
            ("data.batch_size", self.batch_size),
            ("data.repeated_aug", self.repeated_aug),
            ("data.eval_batch_size", self.eval_batch_size),
        )
        require(
            self.num_workers is None or self.num_workers >= 0, f"data.num_workers must be >= 0, got {self.num_workers}"
        )
        require(
            self.batch_size % cfg.trainer.accum_steps == 0,
            f"data.batch_size ({self.batch_size}) must be divisible by trainer.accum_steps ({cfg.trainer.accum_steps})",
        )


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

    def check(self, cfg: RunConfig) -> None:
        for key in ("mix_prob", "switch_prob", "random_erasing"):
            fraction(f"aug.{key}", getattr(self, key))
        require(
            self.mixup_alpha >= 0 and self.cutmix_alpha >= 0,
            f"aug.mixup_alpha and aug.cutmix_alpha must be "
            f">= 0 (0 = off), got {self.mixup_alpha} and {self.cutmix_alpha}",
        )
        fraction("aug.label_smoothing", self.label_smoothing, closed=False)

    def ignored(self, cfg: RunConfig) -> list[tuple[str, str, str]]:
        mix = f"aug.mixup_alpha={self.mixup_alpha}, aug.cutmix_alpha={self.cutmix_alpha}"
        return (
            [("mix_prob", mix, "aug.mixup_alpha > 0 or aug.cutmix_alpha > 0")]
            * (self.mixup_alpha == 0 and self.cutmix_alpha == 0)
            + [("switch_prob", mix, "aug.mixup_alpha > 0 together with aug.cutmix_alpha > 0")]
            * (self.mixup_alpha == 0 or self.cutmix_alpha == 0)
            + [
                (
                    "label_smoothing",
                    f"objective={cfg.objective.name} (it reads no labels)",
                    "objectives trained on labels",
                )
            ]
            * (not getattr(cfg.objective, "reads_labels", True))
        )


@dataclass
class ObjectiveConfig(Option):
    """What the training loss is (objective=NAME). Each objective is a module of its own in
    vit_train/objectives/ with a subclass holding its own keys and its contract (objectives/base.py)."""

    group: ClassVar[str] = "objective"
    metric: ClassVar[str] = ""  # the evaluation's key it is scored by (best.pt, weights=auto)
    higher_is_better: ClassVar[bool] = True
    results: ClassVar[dict[str, str]] = {}  # its numbers in results.json: {key: "maximize" or "minimize"}
    refused_on_resume: ClassVar[dict[str, str]] = {
        "name": "the weights, the loss and the best score belong to another objective"
    }

    name: str


@dataclass
class CallbackConfig(ListedOption):
    """A callback option (callbacks=[NAME, ...]): its keys under callbacks.NAME.*. A subclass sets `name = "..."`,
    its keys as fields with defaults, and `build(cfg)`, the callback the run calls."""

    group: ClassVar[str] = "callbacks"

    def build(self, cfg: Any) -> Any:
        """The callback (callbacks/base.py Callback) for the run of config `cfg`."""
        raise NotImplementedError

    @classmethod
    def unimplemented(cls) -> list[str]:
        return [] if cls.build is not CallbackConfig.build else ["build"]


@dataclass
class LoggerConfig(ListedOption):
    """A logger option (logger=[NAME, ...]): where the run's numbers go besides metrics.jsonl, its keys under
    logger.NAME.*. A subclass sets `name` and `build(cfg)`: a callback (a tracker's adapter, trackers.py), or None
    for what the run writes itself (tensorboard)."""

    group: ClassVar[str] = "logger"

    def build(self, cfg: Any) -> Any:
        raise NotImplementedError

    @classmethod
    def unimplemented(cls) -> list[str]:
        return [] if cls.build is not LoggerConfig.build else ["build"]


class RunConfig(Protocol):
    """The whole run config a section's `check(cfg)` and `ignored(cfg)` read: schema/config.py's Config, by its
    fields. Named here as a protocol because config.py imports this module (and an import back, even for type
    checking only, would be a circle: tests/config/test_layers.py); Config is checked against it in config.py."""

    model: ModelConfig
    data: DataConfig
    aug: AugConfig
    optim: OptimConfig
    schedule: ScheduleConfig
    trainer: TrainerConfig
    objective: ObjectiveConfig
    sweep: SweepConfig
    seed: int
    resume: str | None
    name: str
    tags: list[str]
    logger: dict[str, Any]  # logger=[...]'s options by name (callbacks/base.py LoggerConfig)
    callbacks: dict[str, Any]  # callbacks=[...]'s (callbacks/base.py CallbackConfig)

    @property
    def lr(self) -> float: ...  # the peak learning rate (Config.lr)
