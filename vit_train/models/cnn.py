"""torchvision's ResNets as vit-train models (`model=resnet18`, `model=resnet50`), mainly to train a
CNN teacher for distillation with the same command line.

For small images (32x32 CIFAR, shapes) the ImageNet stem (7x7 stride-2 convolution and max-pool, a
4x downsampling) leaves too little resolution, so the stem becomes one 3x3 stride-1 convolution
without max-pool, as in He et al. 2016 (section 4.2, CIFAR-10) and common CIFAR code
(e.g. kuangliu/pytorch-cifar). Parameter names stay torchvision's (`conv1`, `layer1`..`layer4`, `fc`).
"""

from __future__ import annotations

import torchvision
from torch import nn

SMALL_IMAGE_MAX = 64  # image side up to which the 3x3 stem is used


def build_resnet(arch: str, num_classes: int, img_size: int) -> nn.Module:
    """torchvision's `arch` (resnet18, resnet50, ...) with `num_classes` outputs, randomly initialised;
    a 3x3 stride-1 stem without max-pool when img_size <= 64. Input (B, 3, H, W), output (B, classes)."""
    net = torchvision.models.get_model(arch, weights=None, num_classes=num_classes)
    if img_size <= SMALL_IMAGE_MAX:
        net.conv1 = nn.Conv2d(3, net.conv1.out_channels, kernel_size=3, stride=1, padding=1, bias=False)
        nn.init.kaiming_normal_(net.conv1.weight, mode="fan_out", nonlinearity="relu")  # torchvision's init
        net.maxpool = nn.Identity()
    return net
