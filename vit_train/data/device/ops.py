"""AutoAugment, RandAugment and TrivialAugmentWide for a whole batch on the images' device: each image
draws its own operations, magnitudes and signs, and each operation runs once for all the images that
drew it, each with its own magnitude.

The operations are torchvision's (torchvision/transforms/v2/_auto_augment.py `_apply_image_or_video_transform`,
the kernels in v2/functional/_color.py and _geometry.py) on (B, 3, H, W) uint8 images, with the
parameters torchvision derives from a magnitude, and the same results per image:

- bit for bit, every operation (checked on CPU for every magnitude of torchvision's tables, both signs):
  - ShearX/Y, TranslateX/Y, Rotate: torchvision's inverse affine matrix per image, computed in float64
    torch ops in torchvision's order (its Python `math` may differ in the last float64 bit; the cast to
    float32, as torchvision's `torch.tensor(matrix)`, absorbs that), its sampling grid (the same linspace
    and `bmm`, one matrix per image), `grid_sample`, nearest, fill 0. Rotations by exactly 90, 180 or 270
    degrees, which torchvision does with `rot90`, go through the grid like any angle: pixel centres land on
    pixel centres, the same pixels.
  - Brightness, Color, Contrast, Sharpness: torchvision's float32 arithmetic, truncation to uint8 included
    (Contrast on the CPU is torchvision's own kernel per image: `contrast` says why).
    Where torchvision blends with `add_(x, alpha=s)`, a fused multiply-add (on CPUs with FMA, and on CUDA
    where nvcc fuses by default), the sum is taken in float64, exact for these operands, and rounded once to
    float32: the fused result. Sharpness's 3x3 blur is the integer round(k / 13), which torchvision's float
    blur rounds to as well (k / 13 is never within float error of a half).
  - Posterize, Solarize: per-image bit masks and float32 thresholds, as torchvision's. AutoContrast,
    Equalize and Invert are torchvision's own kernels, which work per image and channel (min/max, 256-bin
    histograms), called once on the chosen images.

Policies (tables as torchvision's `_AUGMENTATION_SPACE` and AutoAugment `_policies`):
- AutoAugment, Cubuk et al. 2019, "AutoAugment: Learning Augmentation Strategies from Data": per image
  one of the policy's 25 sub-policies; each of its two operations runs with its probability at its
  magnitude bin (of 10), with a random sign where the operation has one.
- RandAugment, Cubuk et al. 2020, "RandAugment: Practical automated data augmentation with a reduced search
  space": `num_ops` operations drawn uniformly, with replacement, at one fixed magnitude bin, random signs.
- TrivialAugment Wide, Müller & Hutter 2021, "TrivialAugment: Tuning-free Yet State-of-the-Art Data
  Augmentation": one operation, a uniform magnitude bin (of 31) on the wide ranges, a random sign.

The draws are those distributions, not torchvision's random stream: they come from one torch.Generator
on the images' device, drawn for the whole batch in a fixed order (see each `*_plan`), so the result
is a function of (generator state, batch). A plan (`Plan`) is what was drawn; `apply_plan` applies it.
On CUDA, `apply_plan` waits for the device once per step (how many images drew each operation), `apply_op`
once per call; nothing else leaves the device.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as TF

# ---------------------------------------------------------------------------------------------------
# Operations: (B, 3, H, W) uint8 images and a (B,) magnitude, signed, as torchvision's
# `_apply_image_or_video_transform` receives it; every image is changed.

DEG_TO_RAD = math.pi / 180.0  # math.radians' constant
RAD_TO_DEG = 180.0 / math.pi  # math.degrees'


def _per_image(values: torch.Tensor) -> torch.Tensor:
    return values.view(-1, 1, 1, 1)


def _inverse_affine_matrix(
    angle: torch.Tensor,
    translate: tuple[torch.Tensor, torch.Tensor],
    shear: tuple[torch.Tensor, torch.Tensor],
    center: tuple[float, float],
) -> torch.Tensor:
    """torchvision's `_get_inverse_affine_matrix` (scale 1) for (B,) float64 angles, translations and shears
    in degrees and pixels, operation for operation; (B, 2, 3) float64."""
    rot, sx, sy = angle * DEG_TO_RAD, shear[0] * DEG_TO_RAD, shear[1] * DEG_TO_RAD
    cx, cy = center
    cos_sy, tan_sx, rot_minus_sy = torch.cos(sy), torch.tan(sx), rot - sy
    cx_plus_tx, cy_plus_ty = cx + translate[0], cy + translate[1]
    a = torch.cos(rot_minus_sy) / cos_sy
    b = -(a * tan_sx + torch.sin(rot))
    c = torch.sin(rot_minus_sy) / cos_sy
    d = torch.cos(rot) - c * tan_sx
    m0, m1, m3, m4 = d, -b, -c, a
    m2 = 0.0 + (cx - m0 * cx_plus_tx - m1 * cy_plus_ty)
    m5 = 0.0 + (cy - m3 * cx_plus_tx - m4 * cy_plus_ty)
    return torch.stack([m0, m1, m2, m3, m4, m5], dim=1).view(-1, 2, 3)


def _affine(images: torch.Tensor, matrix: torch.Tensor) -> torch.Tensor:
    """Nearest-neighbour resampling of each image through its inverse affine matrix (B, 2, 3), fill 0:
    torchvision's `_affine_grid` and `_apply_grid_transform`, one grid per image."""
    n, _, h, w = images.shape
    theta = matrix.float()  # (B, 2, 3), as torchvision's torch.tensor(matrix, dtype=float32)
    base = torch.empty(1, h, w, 3, device=images.device)
    base[..., 0].copy_(torch.linspace((1.0 - w) * 0.5, (w - 1.0) * 0.5, steps=w, device=images.device))
    base[..., 1].copy_(torch.linspace((1.0 - h) * 0.5, (h - 1.0) * 0.5, steps=h, device=images.device).unsqueeze(-1))
    base[..., 2].fill_(1)
    rescaled = theta.transpose(1, 2).div(torch.tensor([0.5 * w, 0.5 * h], device=images.device))  # (B, 3, 2)
    grid = base.view(1, h * w, 3).expand(n, -1, -1).bmm(rescaled).view(n, h, w, 2)
    sampled = F.grid_sample(images.float(), grid, mode="nearest", padding_mode="zeros", align_corners=False)
    return sampled.round_().to(torch.uint8)


def _zeros(magnitude: torch.Tensor) -> torch.Tensor:
    return torch.zeros_like(magnitude, dtype=torch.float64)


def _shear(images: torch.Tensor, magnitude: torch.Tensor, vertical: bool) -> torch.Tensor:
    # torchvision: shear angle degrees(atan(magnitude)), centre (0, 0), the top-left corner (see its comment
    # on AutoAugment's shear)
    h, w = images.shape[-2:]
    angle = torch.atan(magnitude.double()) * RAD_TO_DEG
    zero = _zeros(magnitude)
    shear = (zero, angle) if vertical else (angle, zero)
    return _affine(images, _inverse_affine_matrix(zero, (zero, zero), shear, (-0.5 * w, -0.5 * h)))


def _translate(images: torch.Tensor, magnitude: torch.Tensor, vertical: bool) -> torch.Tensor:
    pixels = magnitude.double().trunc()  # torchvision's int(magnitude)
    zero = _zeros(magnitude)
    translate = (zero, pixels) if vertical else (pixels, zero)
    return _affine(images, _inverse_affine_matrix(zero, translate, (zero, zero), (0.0, 0.0)))


def identity(images: torch.Tensor, magnitude: torch.Tensor) -> torch.Tensor:
    return images


def shear_x(images: torch.Tensor, magnitude: torch.Tensor) -> torch.Tensor:
    """Horizontal shear by `magnitude` (tan of the shear angle; x moves by magnitude * y)."""
    return _shear(images, magnitude, vertical=False)


def shear_y(images: torch.Tensor, magnitude: torch.Tensor) -> torch.Tensor:
    return _shear(images, magnitude, vertical=True)


def translate_x(images: torch.Tensor, magnitude: torch.Tensor) -> torch.Tensor:
    """Shift right by int(magnitude) pixels (negative: left)."""
    return _translate(images, magnitude, vertical=False)


def translate_y(images: torch.Tensor, magnitude: torch.Tensor) -> torch.Tensor:
    return _translate(images, magnitude, vertical=True)


def rotate(images: torch.Tensor, magnitude: torch.Tensor) -> torch.Tensor:
    """Rotation by `magnitude` degrees, counter-clockwise, about the centre (torchvision's `rotate`)."""
    angle = torch.remainder(magnitude.double(), 360.0)  # torchvision's angle % 360
    zero = _zeros(magnitude)
    return _affine(images, _inverse_affine_matrix(-angle, (zero, zero), (zero, zero), (0.0, 0.0)))


def _blend(images: torch.Tensor, other: torch.Tensor, ratio: torch.Tensor) -> torch.Tensor:
    """torchvision's `_blend`: images * ratio + other * (1 - ratio), clamped, truncated to uint8. Its
    `add_(other, alpha=1 - ratio)` is a fused multiply-add: the float64 sum below is exact, rounded once."""
    scaled = images.mul(_per_image(ratio.float()))  # (B, 3, H, W) float32
    alpha = _per_image((1.0 - ratio).float()).double()
    return (scaled.double() + other.double() * alpha).float().clamp_(0, 255).to(torch.uint8)


def _grey(images: torch.Tensor) -> torch.Tensor:
    # torchvision's float grey floored; the uint8 grey is that value (non-negative, below 256)
    return TF.rgb_to_grayscale(images).float()  # (B, 1, H, W)


def brightness(images: torch.Tensor, magnitude: torch.Tensor) -> torch.Tensor:
    """Scale by 1 + magnitude (torchvision's adjust_brightness)."""
    factor = _per_image((1.0 + magnitude.double()).float())
    return images.mul(factor).clamp_(0, 255).to(torch.uint8)


def color(images: torch.Tensor, magnitude: torch.Tensor) -> torch.Tensor:
    """Saturation factor 1 + magnitude: a blend with the grey image (torchvision's adjust_saturation)."""
    return _blend(images, _grey(images), 1.0 + magnitude.double())


def contrast(images: torch.Tensor, magnitude: torch.Tensor) -> torch.Tensor:
    """Contrast factor 1 + magnitude: a blend with the mean grey level (torchvision's adjust_contrast).

    On the CPU, torchvision's kernel per image: its `add_` of the broadcast mean is fused (one rounding) in
    the vectorized loop but not in the last partial vector of each image (3*H*W not a multiple of the vector
    length: e.g. element 65 of a 3x5x5 image), so the truncated result differs by one grey level there, and
    where that tail falls depends on the CPU's vector width. On CUDA every element is fused: one batched blend.
    """
    if images.device.type == "cpu":
        factors = (1.0 + magnitude.double()).tolist()
        return torch.stack([TF.adjust_contrast(image, factor) for image, factor in zip(images, factors, strict=True)])
    mean = _grey(images).mean(dim=(-3, -2, -1), keepdim=True)  # (B, 1, 1, 1); sums of integers, exact
    return _blend(images, mean, 1.0 + magnitude.double())


def sharpness(images: torch.Tensor, magnitude: torch.Tensor) -> torch.Tensor:
    """Sharpness factor 1 + magnitude: a blend of the inner pixels with a 3x3 blur (weights 1, centre 5,
    over 13), borders kept (torchvision's adjust_sharpness)."""
    h, w = images.shape[-2:]
    if h <= 2 or w <= 2:
        return images
    x = images.int()
    centre = x[..., 1:-1, 1:-1]  # (B, 3, H-2, W-2)
    window = sum(x[..., i : i + h - 2, j : j + w - 2] for i in range(3) for j in range(3))
    blurred = torch.div(2 * (window + 4 * centre) + 13, 26, rounding_mode="floor")  # round(k / 13), never a tie
    alpha = _per_image((1.0 - (1.0 + magnitude.double())).float()).double()
    inner = (centre.double() + (blurred - centre).double() * alpha).float()  # torchvision's fused add_
    out = images.clone()
    out[..., 1:-1, 1:-1] = inner.clamp_(0, 255).to(torch.uint8)
    return out


def posterize(images: torch.Tensor, magnitude: torch.Tensor) -> torch.Tensor:
    """Keep the int(magnitude) high bits, 0 to 8."""
    bits = magnitude.double().trunc().long().clamp(0, 8)
    mask = ((1 << bits) - 1) << (8 - bits)
    return images & _per_image(mask.to(torch.uint8))


def solarize(images: torch.Tensor, magnitude: torch.Tensor) -> torch.Tensor:
    """Invert the pixels at or above 255 * magnitude (magnitude in [0, 1])."""
    threshold = _per_image((255.0 * magnitude.double()).float())  # torchvision compares in float32
    return torch.where(images >= threshold, images.bitwise_not(), images)


def autocontrast(images: torch.Tensor, magnitude: torch.Tensor) -> torch.Tensor:
    """Stretch each channel to 0-255 (torchvision's batched kernel: per image and channel)."""
    return TF.autocontrast(images)


def equalize(images: torch.Tensor, magnitude: torch.Tensor) -> torch.Tensor:
    """Histogram equalisation, PIL's scheme (torchvision's batched kernel: a 256-bin histogram per image and
    channel)."""
    return TF.equalize(images)


def invert(images: torch.Tensor, magnitude: torch.Tensor) -> torch.Tensor:
    return TF.invert(images)


Op = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
OPS: dict[str, Op] = {
    "Identity": identity,
    "ShearX": shear_x,
    "ShearY": shear_y,
    "TranslateX": translate_x,
    "TranslateY": translate_y,
    "Rotate": rotate,
    "Brightness": brightness,
    "Color": color,
    "Contrast": contrast,
    "Sharpness": sharpness,
    "Posterize": posterize,
    "Solarize": solarize,
    "AutoContrast": autocontrast,
    "Equalize": equalize,
    "Invert": invert,
}
OP_NAMES = tuple(OPS)  # a plan's op numbers index this


def _check(images: torch.Tensor) -> None:
    if images.dtype != torch.uint8 or images.ndim != 4 or images.shape[1] != 3:
        raise ValueError(f"expected (B, 3, H, W) uint8 images, got {tuple(images.shape)} {images.dtype}")


def apply_op(images: torch.Tensor, name: str, magnitude: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Operation `name` (an OP_NAMES entry) on the images where `mask` (B,) bool is true, each with its own
    signed magnitude (B,) (as torchvision's `_apply_image_or_video_transform` takes it); the others are
    returned unchanged. (B, 3, H, W) uint8 in and out, a new tensor."""
    _check(images)
    out = images.clone()
    index = mask.nonzero().squeeze(1)  # a host sync on CUDA
    if len(index):
        out[index] = OPS[name](images[index], magnitude[index])
    return out


# ---------------------------------------------------------------------------------------------------
# Magnitude tables, torchvision's `_AUGMENTATION_SPACE`s: name -> (magnitudes(num_bins, height, width) or
# None, whether a random sign applies).

Space = dict[str, tuple[Callable[[int, int, int], torch.Tensor | None], bool]]

_NONE = (lambda bins, h, w: None, False)
_AUTO_AUGMENT_OPS: Space = {
    "ShearX": (lambda bins, h, w: torch.linspace(0.0, 0.3, bins), True),
    "ShearY": (lambda bins, h, w: torch.linspace(0.0, 0.3, bins), True),
    "TranslateX": (lambda bins, h, w: torch.linspace(0.0, 150.0 / 331.0 * w, bins), True),
    "TranslateY": (lambda bins, h, w: torch.linspace(0.0, 150.0 / 331.0 * h, bins), True),
    "Rotate": (lambda bins, h, w: torch.linspace(0.0, 30.0, bins), True),
    "Brightness": (lambda bins, h, w: torch.linspace(0.0, 0.9, bins), True),
    "Color": (lambda bins, h, w: torch.linspace(0.0, 0.9, bins), True),
    "Contrast": (lambda bins, h, w: torch.linspace(0.0, 0.9, bins), True),
    "Sharpness": (lambda bins, h, w: torch.linspace(0.0, 0.9, bins), True),
    "Posterize": (lambda bins, h, w: (8 - (torch.arange(bins) / ((bins - 1) / 4))).round().int(), False),
    "Solarize": (lambda bins, h, w: torch.linspace(1.0, 0.0, bins), False),
    "AutoContrast": _NONE,
    "Equalize": _NONE,
}
AUTO_AUGMENT_SPACE: Space = {**_AUTO_AUGMENT_OPS, "Invert": _NONE}
RAND_AUGMENT_SPACE: Space = {"Identity": _NONE, **_AUTO_AUGMENT_OPS}
TRIVIAL_AUGMENT_WIDE_SPACE: Space = {
    "Identity": _NONE,
    "ShearX": (lambda bins, h, w: torch.linspace(0.0, 0.99, bins), True),
    "ShearY": (lambda bins, h, w: torch.linspace(0.0, 0.99, bins), True),
    "TranslateX": (lambda bins, h, w: torch.linspace(0.0, 32.0, bins), True),
    "TranslateY": (lambda bins, h, w: torch.linspace(0.0, 32.0, bins), True),
    "Rotate": (lambda bins, h, w: torch.linspace(0.0, 135.0, bins), True),
    "Brightness": (lambda bins, h, w: torch.linspace(0.0, 0.99, bins), True),
    "Color": (lambda bins, h, w: torch.linspace(0.0, 0.99, bins), True),
    "Contrast": (lambda bins, h, w: torch.linspace(0.0, 0.99, bins), True),
    "Sharpness": (lambda bins, h, w: torch.linspace(0.0, 0.99, bins), True),
    "Posterize": (lambda bins, h, w: (8 - (torch.arange(bins) / ((bins - 1) / 6))).round().int(), False),
    "Solarize": (lambda bins, h, w: torch.linspace(1.0, 0.0, bins), False),
    "AutoContrast": _NONE,
    "Equalize": _NONE,
}
AUTO_AUGMENT_BINS = 10  # AutoAugment's magnitude bins (torchvision's `magnitudes_fn(10, ...)`)


def auto_augment_policy(policy: str) -> list[tuple[tuple[str, float, int | None], ...]]:
    """torchvision's 25 sub-policies of 'cifar10', 'imagenet' or 'svhn': ((op, probability, magnitude bin), x2)."""
    return v2.AutoAugment(v2.AutoAugmentPolicy(policy))._policies


@dataclass
class MagnitudeTable:
    """A space on a device: its ops (n,) as OP_NAMES numbers, magnitudes (n, bins) float64 (0 where an op has
    none), signed (n,) bool."""

    ops: torch.Tensor
    magnitudes: torch.Tensor
    signed: torch.Tensor


def magnitude_table(space: Space, num_bins: int, height: int, width: int, device: torch.device) -> MagnitudeTable:
    rows = []
    for _name, (magnitudes, _) in space.items():
        values = magnitudes(num_bins, height, width)  # on the CPU, float32 (Posterize int32), as torchvision's
        rows.append(torch.zeros(num_bins, dtype=torch.float64) if values is None else values.double())
    return MagnitudeTable(
        ops=torch.tensor([OP_NAMES.index(name) for name in space], device=device),
        magnitudes=torch.stack(rows).to(device),
        signed=torch.tensor([signed for _, signed in space.values()], device=device),
    )


# ---------------------------------------------------------------------------------------------------
# Plans: what a policy drew for a batch; applying one.


@dataclass
class Plan:
    """Per image (B) and step (S): the operation, its magnitude and sign, and whether it runs."""

    ops: torch.Tensor  # (B, S) int64, numbers into OP_NAMES
    magnitudes: torch.Tensor  # (B, S) float64, the table's value, unsigned (0 for ops without one)
    signs: torch.Tensor  # (B, S) float64, +1 or -1 (+1 for ops without a sign)
    applied: torch.Tensor  # (B, S) bool: AutoAugment's per-operation probability; always true otherwise

    def signed_magnitudes(self) -> torch.Tensor:
        return self.magnitudes * self.signs


def _signs(negative: torch.Tensor, signed: torch.Tensor) -> torch.Tensor:
    # torchvision: `if signed and torch.rand(()) <= 0.5: magnitude *= -1`
    return torch.where(negative & signed, -1.0, 1.0).double()


def auto_augment_plan(batch_size: int, height: int, width: int, policy: str, generator: torch.Generator) -> Plan:
    """AutoAugment's draws for a batch, on the generator's device. In this order, for the whole batch: the
    sub-policy of each image, randint(25, (B,)); the probability draws, rand(B, 2), an operation runs where
    its draw <= its probability; the sign draws, rand(B, 2), negative where <= 0.5 and the op has a sign."""
    device = generator.device
    subs = auto_augment_policy(policy)
    table = magnitude_table(AUTO_AUGMENT_SPACE, AUTO_AUGMENT_BINS, height, width, device)
    names = list(AUTO_AUGMENT_SPACE)
    rows = [names.index(name) for sub in subs for name, _, _ in sub]  # (25 * 2,) rows of the table
    bins = [0 if level is None else level for sub in subs for _, _, level in sub]
    probability = torch.tensor([[p for _, p, _ in sub] for sub in subs], device=device)  # (25, 2) float32
    rows_t, bins_t = torch.tensor(rows, device=device).view(-1, 2), torch.tensor(bins, device=device).view(-1, 2)

    chosen = torch.randint(len(subs), (batch_size,), generator=generator, device=device)
    runs = torch.rand(batch_size, 2, generator=generator, device=device) <= probability[chosen]
    negative = torch.rand(batch_size, 2, generator=generator, device=device) <= 0.5
    row = rows_t[chosen]  # (B, 2)
    return Plan(
        ops=table.ops[row],
        magnitudes=table.magnitudes[row, bins_t[chosen]],
        signs=_signs(negative, table.signed[row]),
        applied=runs,
    )


def rand_augment_plan(
    batch_size: int,
    height: int,
    width: int,
    num_ops: int,
    magnitude: int,
    generator: torch.Generator,
    num_magnitude_bins: int = 31,
) -> Plan:
    """RandAugment's draws for a batch. In this order: the operations, randint(14, (B, num_ops)), uniform with
    replacement over RAND_AUGMENT_SPACE; the sign draws, rand(B, num_ops), negative where <= 0.5 and the op has
    a sign. Every op runs at bin `magnitude` of `num_magnitude_bins`."""
    if not 0 <= magnitude < num_magnitude_bins:
        raise ValueError(f"magnitude must be in [0, {num_magnitude_bins}), got {magnitude}")
    device = generator.device
    table = magnitude_table(RAND_AUGMENT_SPACE, num_magnitude_bins, height, width, device)
    row = torch.randint(len(RAND_AUGMENT_SPACE), (batch_size, num_ops), generator=generator, device=device)
    negative = torch.rand(batch_size, num_ops, generator=generator, device=device) <= 0.5
    return Plan(
        ops=table.ops[row],
        magnitudes=table.magnitudes[row, magnitude],
        signs=_signs(negative, table.signed[row]),
        applied=torch.ones_like(row, dtype=torch.bool),
    )


def trivial_augment_wide_plan(
    batch_size: int, height: int, width: int, generator: torch.Generator, num_magnitude_bins: int = 31
) -> Plan:
    """TrivialAugmentWide's draws for a batch. In this order: the operation, randint(14, (B, 1)), over
    TRIVIAL_AUGMENT_WIDE_SPACE; its magnitude bin, randint(num_magnitude_bins, (B, 1)); the sign draw,
    rand(B, 1), negative where <= 0.5 and the op has a sign."""
    device = generator.device
    table = magnitude_table(TRIVIAL_AUGMENT_WIDE_SPACE, num_magnitude_bins, height, width, device)
    row = torch.randint(len(TRIVIAL_AUGMENT_WIDE_SPACE), (batch_size, 1), generator=generator, device=device)
    level = torch.randint(num_magnitude_bins, (batch_size, 1), generator=generator, device=device)
    negative = torch.rand(batch_size, 1, generator=generator, device=device) <= 0.5
    return Plan(
        ops=table.ops[row],
        magnitudes=table.magnitudes[row, level],
        signs=_signs(negative, table.signed[row]),
        applied=torch.ones_like(row, dtype=torch.bool),
    )


def apply_plan(images: torch.Tensor, plan: Plan) -> torch.Tensor:
    """The plan's operations, step after step, on (B, 3, H, W) uint8 images: at each step, each operation
    once, on all the images that drew it and run it, with their own magnitudes. A new tensor."""
    _check(images)
    out = images.clone()
    signed = plan.signed_magnitudes()
    identity_op = OP_NAMES.index("Identity")
    for step in range(plan.ops.shape[1]):
        op = plan.ops[:, step].masked_fill(~plan.applied[:, step], identity_op)  # (B,)
        counts = torch.bincount(op, minlength=len(OP_NAMES)).tolist()  # the step's one host sync on CUDA
        groups = torch.argsort(op, stable=True).split(counts)  # image numbers, by operation
        for name, index in zip(OP_NAMES, groups, strict=True):
            if name != "Identity" and len(index):
                out[index] = OPS[name](out[index], signed[index, step])
    return out


def auto_augment(images: torch.Tensor, policy: str, generator: torch.Generator) -> torch.Tensor:
    """AutoAugment (policy 'cifar10', 'imagenet' or 'svhn') of each image of a (B, 3, H, W) uint8 batch."""
    return apply_plan(images, auto_augment_plan(len(images), *images.shape[-2:], policy, generator))


def rand_augment(
    images: torch.Tensor, num_ops: int, magnitude: int, generator: torch.Generator, num_magnitude_bins: int = 31
) -> torch.Tensor:
    """RandAugment(num_ops, magnitude) of each image of a (B, 3, H, W) uint8 batch."""
    plan = rand_augment_plan(len(images), *images.shape[-2:], num_ops, magnitude, generator, num_magnitude_bins)
    return apply_plan(images, plan)


def trivial_augment_wide(
    images: torch.Tensor, generator: torch.Generator, num_magnitude_bins: int = 31
) -> torch.Tensor:
    """TrivialAugmentWide of each image of a (B, 3, H, W) uint8 batch."""
    plan = trivial_augment_wide_plan(len(images), *images.shape[-2:], generator, num_magnitude_bins)
    return apply_plan(images, plan)
