"""model.arch=resnet18, resnet50: torchvision's ResNets, mainly a CNN teacher for distillation trained with the same
command line (model=resnet18, model=resnet50).

For small images (32x32 CIFAR, shapes) the ImageNet stem (7x7 stride-2 convolution and max-pool, a 4x downsampling)
leaves too little resolution, so the stem becomes one 3x3 stride-1 convolution without max-pool, as in He et al. 2016
(section 4.2, CIFAR-10) and common CIFAR code (e.g. kuangliu/pytorch-cifar). Parameter names stay torchvision's
(`conv1`, `layer1`..`layer4`, `fc`).

Their keys are the model group's own (model.img_size, model.pretrained, model.reset_head): nothing of a ViT. The
architecture is the name and the stem (the 3x3 stride-1 stem up to SMALL_IMAGE_MAX pixels); a
state dict shows its block counts, whose torchvision name it names. FSDP shards each of the four stages; layer-wise
lr decay has no layers here (refused in one line). Importing it imports no torch.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from vit_train.schema.sections import ModelConfig

if TYPE_CHECKING:
    import torch
    from torch import nn

RESNET_BLOCK = re.compile(r"^layer(\d)\.(\d+)\.")
RESNETS = {
    (2, 2, 2, 2, False): "resnet18",
    (3, 4, 6, 3, False): "resnet34",
    (3, 4, 6, 3, True): "resnet50",
    (3, 4, 23, 3, True): "resnet101",
    (3, 8, 36, 3, True): "resnet152",
}
SMALL_IMAGE_MAX = 64  # image side up to which the 3x3 stem is used (`build_resnet`)


@dataclass
class ResNet(ModelConfig):
    """A torchvision ResNet; a subclass per depth registers its model.arch."""

    ARCHITECTURE = ("model.stem",)
    refused_on_resume = {
        **ModelConfig.refused_on_resume,
        "img_size": "the stem was chosen for another image size (3x3 up to 64 pixels, else 7x7)",
    }

    def build(self, num_classes: int) -> nn.Module:
        assert self.img_size is not None  # Config.validate fills it from the data set
        return build_resnet(self.arch, num_classes, self.img_size)

    def flops_per_image(self, num_classes: int) -> float:
        from vit_train.models.flops import training_flops

        assert self.img_size is not None  # Config.validate fills it from the data set
        return training_flops(lambda: self.build(num_classes), self.img_size, lambda m, x: m(x))

    @classmethod
    def architecture(cls, saved: dict[str, Any]) -> dict[str, Any]:
        small = (saved.get("img_size") or 224) <= SMALL_IMAGE_MAX
        return {
            "model.arch": saved.get("arch", cls.arch),
            "model.stem": "3x3 (small images)" if small else "7x7 (ImageNet)",
        }

    @classmethod
    def reveals(cls, weights: dict[str, torch.Tensor]) -> dict[str, Any] | None:
        """Its block counts (a torchvision depth's name, else "a ResNet with blocks [...]") and its stem."""
        if not any(RESNET_BLOCK.match(k) for k in weights):
            return None
        blocks = [
            len({m.group(2) for k in weights if (m := RESNET_BLOCK.match(k)) and m.group(1) == str(i)})
            for i in range(1, 5)
        ]
        bottleneck = any(k.endswith(".conv3.weight") for k in weights)
        conv1 = weights.get("conv1.weight")
        found = {
            "model.arch": RESNETS.get(
                (blocks[0], blocks[1], blocks[2], blocks[3], bottleneck), f"a ResNet with blocks {blocks}"
            )
        }
        if conv1 is not None:
            found["model.stem"] = "3x3 (small images)" if conv1.shape[-1] == 3 else "7x7 (ImageNet)"
        return found

    def shard_units(self, model: nn.Module) -> list[nn.Module]:
        """The four stages (layer1 ... layer4)."""
        return [getattr(model, f"layer{i}") for i in range(1, 5) if hasattr(model, f"layer{i}")]


@dataclass
class ResNet18(ResNet):
    arch: str = "resnet18"


@dataclass
class ResNet50(ResNet):
    arch: str = "resnet50"


def build_resnet(arch: str, num_classes: int, img_size: int) -> nn.Module:
    """torchvision's `arch` (resnet18, resnet50, ...) with `num_classes` outputs, randomly initialised;
    a 3x3 stride-1 stem without max-pool when img_size <= 64. Input (B, 3, H, W), output (B, classes)."""
    import torchvision
    from torch import nn

    net = torchvision.models.get_model(arch, weights=None, num_classes=num_classes)
    if img_size <= SMALL_IMAGE_MAX:
        net.conv1 = nn.Conv2d(3, net.conv1.out_channels, kernel_size=3, stride=1, padding=1, bias=False)
        nn.init.kaiming_normal_(net.conv1.weight, mode="fan_out", nonlinearity="relu")  # torchvision's init
        net.maxpool = nn.Identity()
    return net
