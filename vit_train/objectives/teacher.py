"""objective=distill's teacher and loss (DeiT, Touvron et al. 2021; distill.py is the option and says what the
loss is): the teacher read through the door for weights (objectives/weights_in.py) and checked against the student,
and the loss that learns from it, which the option's `build_loss` makes.

The teacher sees the same (augmented, mixed) images as the student, under the same autocast, in eval mode and
without gradients. It is not part of the model, so it is in no checkpoint; its path is in the config and its
SHA-256 in the checkpoint (`DistillationLoss.state_dict`), which a resumed run checks (`load_state_dict`).
`objective` and `cfg` of the distillation: the run's objective section (distill.py `Distill`: teacher,
teacher_arch, type, alpha, tau).
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
from pathlib import Path
from typing import Any, Literal, Protocol

import torch
import torch.nn.functional as F
from torch import nn

from vit_train.checkpoint import open_weights, resolve
from vit_train.errors import CheckpointError, ConfigError
from vit_train.objectives.base import Loss, Objective
from vit_train.objectives.weights_in import check_classes, first_difference
from vit_train.schema.config import Config
from vit_train.schema.legacy import saved_arch
from vit_train.schema.sections import ModelConfig
from vit_train.schema.typed import options, overridden

log = logging.getLogger("vit_train")


class TeacherOptions(Protocol):
    """The keys of objective=distill that the teacher and its loss read: objectives/distill.py Distill's (which
    imports this module, so it is named here by its fields)."""

    teacher: str | None
    teacher_arch: str | None
    type: Literal["hard", "soft"]
    alpha: float
    tau: float


def distillation_loss_for(
    objective: TeacherOptions, cfg: Config, model: nn.Module, num_classes: int, class_names: list[str] | None = None
) -> DistillationLoss:
    """The loss of `objective` for `model` (on its device), with the teacher objective.teacher names; `class_names`
    (the data's) are compared with the teacher's when its file records them."""
    device, img_size = next(model.parameters()).device, cfg.model.img_size
    assert img_size is not None  # Config.validate fills it from the data set
    with torch.random.fork_rng():  # building the teacher (its throw-away init) must not move the run's RNG
        teacher, described, path = load_teacher(
            objective, num_classes, img_size, resuming=bool(cfg.resume), class_names=class_names, with_path=True
        )
        teacher = teacher.to(device).eval().requires_grad_(False)
        check_teacher_output(teacher, num_classes, img_size, device)
    # the file itself (a run directory's best.pt), as a new run and a resumed one both read it
    info = {"teacher": objective.teacher, "teacher_sha256": file_sha256(path), "teacher_model": described}
    two_heads = bool(getattr(model, "head_dist", None))
    log.info(
        "distilling from %s (%s, %.2fM parameters): %s, alpha %g%s%s",
        objective.teacher,
        described,
        sum(p.numel() for p in teacher.parameters()) / 1e6,
        objective.type,
        objective.alpha,
        f", tau {objective.tau:g}" if objective.type == "soft" else "",
        ""
        if two_heads
        else "; the student has no distillation head (model.distilled=false): both terms train its one head",
    )
    return DistillationLoss(teacher, objective, cfg.aug.label_smoothing, two_heads, info)


def distillation_loss(
    cls_logits: torch.Tensor,
    dist_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    targets: torch.Tensor,
    base: nn.Module,
    cfg: TeacherOptions,
) -> torch.Tensor:
    """DeiT's loss for logits (B, classes): `base` (the classification criterion, e.g. cross-entropy
    with label smoothing) on the class head, the teacher term on the distillation head."""
    label_term, teacher_term = loss_terms(cls_logits, dist_logits, teacher_logits, targets, base, cfg)
    return (1 - cfg.alpha) * label_term + cfg.alpha * teacher_term


def loss_terms(
    cls_logits: torch.Tensor,
    dist_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    targets: torch.Tensor,
    base: nn.Module,
    cfg: TeacherOptions,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(the label term, the teacher term) of `distillation_loss`, each a scalar before its alpha weight."""
    if cfg.type == "hard":
        teacher_term = F.cross_entropy(dist_logits, teacher_logits.argmax(dim=1))
    else:
        tau = cfg.tau
        teacher_term = (
            F.kl_div(
                F.log_softmax(dist_logits.float() / tau, dim=1),
                F.log_softmax(teacher_logits.float() / tau, dim=1),
                reduction="batchmean",
                log_target=True,
            )
            * tau
            * tau
        )
    return base(cls_logits, targets), teacher_term


TERMS = ("loss_label", "loss_teacher", "teacher_agreement", "images")  # what `terms` sums


class DistillationLoss(Loss):
    """objective=distill's loss: (module, images, targets) -> (loss, logits for the training top-1)."""

    def __init__(
        self, teacher: nn.Module, cfg: TeacherOptions, label_smoothing: float, two_heads: bool, info: dict[str, Any]
    ):
        self.teacher, self.cfg, self.two_heads = teacher, cfg, two_heads
        self.base = nn.CrossEntropyLoss(label_smoothing=label_smoothing)
        self.checkpoint_info = info  # plain data: what the checkpoint records of the teacher
        # the logged terms' image-weighted sums since the last `terms()`, on the device, updated in place (a compiled
        # step traces the call: train/compiled_step.py)
        device = next(teacher.parameters()).device
        self.sums = {key: torch.zeros((), device=device) for key in TERMS}

    def __call__(
        self, module: nn.Module, images: torch.Tensor, targets: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.no_grad():
            teacher_logits = self.teacher(images)
        if self.two_heads:
            cls_logits, dist_logits = module(images, both_heads=True)
            logits = (cls_logits.detach() + dist_logits.detach()) / 2  # what evaluation predicts
        else:
            cls_logits = dist_logits = logits = module(images)
        label_term, teacher_term = loss_terms(cls_logits, dist_logits, teacher_logits, targets, self.base, self.cfg)
        self._count(label_term, teacher_term, logits, teacher_logits)
        return (1 - self.cfg.alpha) * label_term + self.cfg.alpha * teacher_term, logits

    def _count(
        self, label_term: torch.Tensor, teacher_term: torch.Tensor, logits: torch.Tensor, teacher_logits: torch.Tensor
    ) -> None:
        """Add one micro-batch to the logged terms (image-weighted sums; no host sync)."""
        n = len(logits)
        batch = {
            "loss_label": label_term.detach().float() * n,
            "loss_teacher": teacher_term.detach().float() * n,
            "teacher_agreement": (logits.detach().argmax(1) == teacher_logits.argmax(1)).sum().float(),
            "images": torch.tensor(float(n), device=logits.device),
        }
        for key, value in batch.items():
            self.sums[key].add_(value)

    def terms(self) -> dict[str, float]:
        """The loss's two terms (before their alpha weights; mean over the images since the last call) and
        the teacher agreement (% of those images whose prediction is the teacher's), for the train rows of
        metrics.jsonl and TensorBoard; this process's images (rank 0 logs). Starts a new window."""
        values = {k: v.item() for k, v in self.sums.items()}
        for v in self.sums.values():
            v.zero_()
        images = values.pop("images")
        if not images:
            return {}
        return {k: (100 if k == "teacher_agreement" else 1) * v / images for k, v in values.items()}

    def window_state(self) -> dict[str, float]:
        """The logged terms' sums since the last `terms()` as plain data (the checkpoint's train_window "terms")."""
        values = {k: v.item() for k, v in self.sums.items()}
        return values if values["images"] else {}

    def load_window(self, saved: dict[str, float]) -> None:
        """Continue the sums `window_state` kept (float32, as summed), so the next train row is the uninterrupted run's."""
        for key, value in saved.items():
            self.sums[key].fill_(value)

    def state_dict(self) -> dict[str, Any]:
        """What the checkpoint keeps (under "objective"): the teacher's path, SHA-256 and network, never its weights."""
        return dict(self.checkpoint_info)

    def load_state_dict(self, saved: dict[str, Any] | None) -> None:
        """Refuse to resume with another teacher file than the checkpoint's run used."""
        if saved and saved.get("teacher_sha256") not in (None, self.checkpoint_info["teacher_sha256"]):
            raise CheckpointError(
                f"objective.teacher {self.checkpoint_info['teacher']} is not the file this run "
                f"started with (SHA-256 differs); resume with the original teacher, or start a new "
                f"run from these weights with model.pretrained=<the checkpoint>"
            )


def file_sha256(path: Path) -> str:
    """The SHA-256 of the file `path`, or of a Hub folder's config.json and model.safetensors (in that order)."""
    digest = hashlib.sha256()
    for name in ("config.json", "model.safetensors") if path.is_dir() else ("",):
        with open(path / name if name else path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()


def teacher_file(cfg: TeacherOptions, resuming: bool = False) -> Path:
    """The file `cfg.teacher` names, by the rule of every door for weights (objectives/weights_in.py
    `resolve`: a file, or a run directory's best.pt). ConfigError (one line) when there is none; for a
    relative path in a resumed run, it says the path is relative to where the first run started."""
    if not cfg.teacher:
        raise ConfigError(
            "objective.teacher is not set; give a vit-train checkpoint (.pt) or run directory, a "
            ".safetensors file, or objective.teacher_arch=NAME with a state-dict file"
        )
    path = Path(cfg.teacher).expanduser()
    if not path.exists() and resuming and not path.is_absolute():
        raise ConfigError(
            f"objective.teacher={cfg.teacher} does not exist from {Path.cwd()}: a relative teacher path "
            f"is relative to where the first run started; resume with objective.teacher=<its new path> "
            f"(the same file, the same SHA-256)"
        )
    return resolve(cfg.teacher, "objective.teacher")


def load_teacher(
    cfg: TeacherOptions,
    num_classes: int,
    img_size: int,
    resuming: bool = False,
    class_names: list[str] | None = None,
    with_path: bool = False,
):
    """(teacher on the CPU, a description[, the file read]): through the door for weights
    (objectives/weights_in.py: a vit-train checkpoint or run directory, whose better-scoring weights are
    taken and logged, or a .safetensors exported by vit-train; rebuilt from the config it carries, a ViT
    at another size getting its positions interpolated to `img_size`), or `teacher_arch` (a torchvision
    classification model, else a timm model when timm is installed) with a state-dict file. ConfigError
    (one line) for a missing file (`resuming`: see teacher_file), one without a classifier head (e.g. MAE
    pre-training), or a teacher whose recorded classes are not `class_names` (names and order)."""
    path = teacher_file(cfg, resuming)
    assert cfg.teacher is not None  # teacher_file refuses a run without one
    incoming = open_weights(
        cfg.teacher, "objective.teacher"
    )  # the file teacher_file found, logged as the user wrote it
    hub_model = (incoming.metadata or {}).get("hub_model") if incoming.config is None else None
    if hub_model is not None:  # a timm Hub folder whose config.json says the whole network: built as vit-train's ViT
        incoming = dataclasses.replace(incoming, config={"model": hub_model})
    if incoming.config is not None and "model" in incoming.config:
        if cfg.teacher_arch is not None:
            raise ConfigError(
                f"objective.teacher={path.name} is a {'Hub folder' if path.is_dir() else 'vit-train checkpoint'}, "
                f"which names its own network "
                f"({incoming.config['model'].get('name', incoming.config['model'].get('arch'))}): drop "
                f"objective.teacher_arch={cfg.teacher_arch}"
            )
        if class_names is not None:
            check_classes(incoming, class_names, "distil from a teacher trained on these classes, in this order")
        teacher, described = vit_train_teacher(incoming, num_classes, img_size)
        if hub_model is not None:
            described = f"timm's {hub_model['name']} from its Hub folder, as vit-train's ViT"
    elif cfg.teacher_arch is None:
        raise ConfigError(
            f"objective.teacher={path} holds plain weights without a vit-train config; name the network "
            f"with objective.teacher_arch (e.g. resnet50, or a timm model name)"
        )
    else:
        teacher, described = (
            named_teacher(cfg.teacher_arch, incoming.weights, num_classes, img_size, path),
            cfg.teacher_arch,
        )
    return (teacher, described, path) if with_path else (teacher, described)


def vit_train_teacher(incoming, num_classes: int, img_size: int) -> tuple[nn.Module, str]:
    """The network a vit-train file names, with the weights the door took; a ViT at the student's image size."""
    saved, path, class_names = incoming.config, incoming.path, incoming.class_names
    family = options("model").get(saved_arch(saved["model"]))
    # a family whose weights fit another image size (a ViT's positions) runs at the student's; a CNN as it was trained
    is_vit = family is not None and overridden(family, ModelConfig, "fit_size")
    try:
        teacher_model = Config.from_dict(
            {"model": {**saved["model"], **({"img_size": img_size} if is_vit else {})}}
        ).model
    except ConfigError as e:
        patch = saved["model"].get("patch_size")
        if not is_vit or not patch or img_size % patch == 0:
            raise ConfigError(f"objective.teacher={incoming.given}: its saved config does not hold ({e})") from None
        raise ConfigError(
            f"objective.teacher={incoming.given} is a ViT with {saved['model'].get('patch_size')}-pixel "
            f"patches, which do not tile the student's {img_size}x{img_size} images (model.img_size="
            f"{img_size}); give the student an image size divisible by "
            f"{saved['model'].get('patch_size')}, or distil from another teacher"
        ) from None
    weights = incoming.weights
    teacher = teacher_model.build(num_classes)
    refuse_headless(path, weights, teacher, saved)
    if class_names is not None and len(class_names) != num_classes:
        raise ConfigError(
            f"objective.teacher {path.name} predicts {len(class_names)} classes, the data has "
            f"{num_classes}; distil from a teacher trained on these classes"
        )
    try:
        teacher.load_state_dict(teacher_model.fit_size(teacher, weights))
    except RuntimeError as e:  # tensors that do not fit the network the file's own config names
        raise ConfigError(
            f"objective.teacher={incoming.given}: its weights do not fit the network its config names "
            f"({first_difference(e)}); the file was edited or damaged: distil from a sound one"
        ) from None
    return teacher, f"vit-train {teacher_model.name}"


def refuse_headless(path: Path, weights: dict, teacher: nn.Module, saved: dict) -> None:
    """ConfigError (one line) when `weights` hold no classifier head for `teacher` (its head.* or fc.*
    tensors): a masked-autoencoder pre-training checkpoint (encoder.*, decoder.*) or any other headless file."""
    heads = [k for k in teacher.state_dict() if k.startswith(("head.", "fc."))]
    if all(k in weights for k in heads):
        return
    name = str((saved.get("objective") or {}).get("name"))
    trained_for = options("objective").get(name)
    if trained_for is not None and issubclass(trained_for, Objective) and not trained_for.predicts:
        raise ConfigError(
            f"objective.teacher={path} is a {trained_for.title} checkpoint (objective={name}); "
            f"it has no classifier to teach with. Fine-tune it first: vit-train model.pretrained=<its run "
            f"directory> (docs/finetuning.md), then distil from that run"
        )
    raise ConfigError(
        f"objective.teacher={path} holds no classifier head ({', '.join(heads) or 'head.*'} missing); a "
        f"teacher must be a trained classifier: fine-tune it first (model.pretrained=<it>)"
    )


def named_teacher(arch: str, weights: dict, num_classes: int, img_size: int, path: Path) -> nn.Module:
    """torchvision's `arch` (a ResNet's stem picked from the weights' conv1), else timm's `arch`."""
    import torchvision

    weights = {k.removeprefix("module.").removeprefix("_orig_mod."): v for k, v in weights.items()}
    if arch in torchvision.models.list_models(module=torchvision.models):
        if arch.startswith("resnet") and "conv1.weight" in weights:
            from vit_train.models.families.resnet import build_resnet

            small = weights["conv1.weight"].shape[-1] == 3  # vit-train's small-image stem
            teacher = build_resnet(arch, num_classes, img_size if small else 224)
        else:
            teacher = torchvision.models.get_model(arch, weights=None, num_classes=num_classes)
    else:
        try:
            import timm
        except ImportError:
            raise ConfigError(
                f"objective.teacher_arch={arch} is not a torchvision classification model, and timm "
                f"(for timm model names) is not installed: pip install timm"
            ) from None
        if not timm.is_model(arch):
            raise ConfigError(
                f"objective.teacher_arch={arch} is neither a torchvision classification model nor a "
                f"timm model name (e.g. resnet50, regnety_160)"
            )
        teacher = timm.create_model(arch, pretrained=False, num_classes=num_classes)
    try:
        teacher.load_state_dict(weights)
    except RuntimeError as e:
        raise ConfigError(
            f"objective.teacher={path.name} does not fit {arch} with {num_classes} classes: {first_difference(e)}"
        ) from None
    return teacher


@torch.no_grad()
def check_teacher_output(teacher: nn.Module, num_classes: int, img_size: int, device: torch.device) -> None:
    """One forward on a blank image: the teacher must take the student's images and give (B, num_classes)."""
    try:
        out = teacher(torch.zeros(1, 3, img_size, img_size, device=device))
    except (RuntimeError, ValueError, AssertionError) as e:  # shape errors; timm asserts the input size
        raise ConfigError(f"the teacher cannot take {img_size}x{img_size} images ({str(e).splitlines()[0]})") from None
    if out.shape != (1, num_classes):
        raise ConfigError(
            f"the teacher gives outputs of shape {tuple(out.shape[1:])} for one image; the student "
            f"needs ({num_classes},) class logits"
        )
