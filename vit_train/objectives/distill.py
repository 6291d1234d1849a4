"""Knowledge distillation as in DeiT (Touvron et al. 2021, "Training data-efficient image transformers
& distillation through attention"): the objective `objective.name=distill` and its frozen teacher.

The loss is (1 - alpha) * CE(class head, labels) + alpha * L_teacher(distillation head, teacher)
(logged apart as the train rows' loss_label and loss_teacher, with teacher_agreement, `Distill.terms`):

- hard: CE(distillation head, argmax of the teacher's logits) (DeiT's best; no label smoothing on
  this branch, DeiT issue #56);
- soft: tau^2 * KL(softmax(teacher / tau) || softmax(student / tau)), averaged over the images
  (Hinton et al. 2015). DeiT's code divides that sum by the number of logits (batch x classes), which
  makes the soft term 1000x weaker on ImageNet than the paper's formula (DeiT issues #61, #116,
  #134); vit-train follows the formula.

A student with `model.distilled=true` has the two heads (DeiT); any other model (a plain ViT, a
ResNet) gets both terms on its single output (Hinton's distillation). The teacher and the loss are
teacher.py's: the teacher sees the same (augmented, mixed) images as the student, in eval mode and without
gradients, and is in no checkpoint (its path is in the config, its SHA-256 in the checkpoint).

As an objective (objectives/base.py) it is a classify (the same model, evaluation, val top-1 score and
inference) with a teacher, which objective.teacher must name (`check`); its keys were distill.* before.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from vit_train.errors import CheckpointError
from vit_train.objectives.classify import Classify
from vit_train.schema.typed import fraction, require

if TYPE_CHECKING:
    from torch import nn

    from vit_train.objectives.base import Loss
    from vit_train.schema.config import Config
    from vit_train.schema.sections import RunConfig


@dataclass
class Distill(Classify):
    """objective=distill: DeiT's loss with the teacher objective.teacher names."""

    default = False
    title = "distillation"
    moved_from = "distill"
    refused_on_resume = {
        **Classify.refused_on_resume,
        "teacher_arch": "the teacher is another network",
        "type": "the distillation head was trained on other targets",
    }

    name: str = "distill"
    teacher: str | None = None  # a vit-train checkpoint or .safetensors, or a state-dict file with teacher_arch
    teacher_arch: str | None = None  # null for vit-train files; else a torchvision or timm model name, e.g. resnet50
    type: Literal["hard", "soft"] = "hard"  # hard: CE on the teacher's argmax (DeiT's best); soft: KL at tau
    alpha: float = 0.5  # weight of the teacher term; the label term gets 1 - alpha (DeiT's default 0.5)
    tau: float = 1.0  # soft: softmax temperature (DeiT's default 1.0)

    def check(self, cfg: RunConfig) -> None:
        """Refuse (ConfigError, one line) a run without a teacher, and impossible alpha or tau."""
        fraction("objective.alpha", self.alpha)
        require(self.tau > 0, f"objective.tau must be > 0, got {self.tau}")
        require(
            bool(self.teacher),
            f"objective={self.name} needs objective.teacher=PATH: a vit-train checkpoint or "
            f".safetensors, or a state-dict file with objective.teacher_arch=NAME",
        )

    def ignored(self, cfg: RunConfig) -> list[tuple[str, str, str]]:
        return [("tau", "objective.type=hard", "objective.type=soft")] * (self.type == "hard")

    def check_run(self, cfg: Config) -> None:
        """A teacher that is not there is refused before any work."""
        from vit_train.objectives.teacher import teacher_file

        teacher_file(self, resuming=bool(cfg.resume))

    def check_resume(self, saved: dict[str, Any] | None, path: Any) -> None:
        """A resumed run reads the teacher file its run started with (the SHA-256 its checkpoint keeps)."""
        from vit_train.objectives.teacher import file_sha256, teacher_file

        if saved and saved.get("teacher_sha256") not in (None, file_sha256(teacher_file(self, resuming=True))):
            raise CheckpointError(
                f"objective.teacher {self.teacher} is not the file this run started with (SHA-256 "
                f"differs); resume with the original teacher, {self.restart_hint(path)}"
            )

    def build_loss(
        self, cfg: Config, model: nn.Module, num_classes: int, class_names: list[str] | None = None, rank: int = 0
    ) -> Loss:
        """The distill loss for `model` (on its device), with the teacher objective.teacher names; `class_names`
        (the data's) are compared with the teacher's when its file records them (teacher.py)."""
        from vit_train.objectives.teacher import distillation_loss_for

        return distillation_loss_for(self, cfg, model, num_classes, class_names)
