"""Batched per-image augmentation (data/device/ops.py) against torchvision, image by image.

The oracle is torchvision's own mapping from (operation, signed magnitude) to its v2.functional call,
`_apply_image_or_video_transform` (transforms/v2/_auto_augment.py), on one image at a time: every operation
must equal it bit for bit, geometric ones included (nearest neighbour, fill 0). The magnitudes are every
value of torchvision's three `_AUGMENTATION_SPACE`s, both signs, and right angles. Policies: each image of
`apply_plan` equals torchvision's operations in sequence with the drawn parameters; over 20,000 plans each
(step, operation, magnitude) occurs at the rate torchvision's tables and AutoAugment's sub-policies give,
within 5 binomial sigma."""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch
from torchvision.transforms import v2

from vit_train.data.device import ops as D

SIZES = [(16, 16), (32, 32), (24, 16)]  # (H, W); non-square: rotations by 90 degrees take the grid path
TV_SPACES = {  # torchvision's (space, magnitude bins) per policy
    "autoaug": (v2.AutoAugment._AUGMENTATION_SPACE, 10),
    "randaug": (v2.RandAugment._AUGMENTATION_SPACE, 31),
    "trivial": (v2.TrivialAugmentWide._AUGMENTATION_SPACE, 31),
}
REFERENCE = v2.AutoAugment()


def torchvision_op(image: torch.Tensor, name: str, magnitude: float) -> torch.Tensor:
    return REFERENCE._apply_image_or_video_transform(image, name, magnitude, interpolation=v2.InterpolationMode.NEAREST,
                                                     fill=REFERENCE._fill)


def torchvision_plan(image: torch.Tensor, plan: D.Plan, i: int) -> torch.Tensor:
    for step in range(plan.ops.shape[1]):
        if plan.applied[i, step]:
            image = torchvision_op(image, D.OP_NAMES[plan.ops[i, step]], float(plan.signed_magnitudes()[i, step]))
    return image


def varied_images(h: int, w: int, seed: int = 0) -> torch.Tensor:
    """(32, 3, h, w) uint8: random images, gradients, constants, low contrast, two levels, saturated colours."""
    g = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 256, (32, 3, h, w), generator=g, dtype=torch.uint8)
    ramp_x = torch.linspace(0, 255, w).round().to(torch.uint8).expand(3, h, w)
    ramp_y = torch.linspace(0, 255, h).round().to(torch.uint8)[:, None].expand(3, h, w)
    images[0], images[1], images[2] = ramp_x, ramp_y, ramp_x // 2 + ramp_y // 2
    images[3], images[4], images[5] = 0, 128, 255
    images[6] = 100 + torch.randint(0, 4, (3, h, w), generator=g).to(torch.uint8)  # low contrast
    images[7] = 60 + 8 * torch.randint(0, 2, (3, h, w), generator=g).to(torch.uint8)  # two levels
    images[8] = torch.tensor([255, 0, 0], dtype=torch.uint8)[:, None, None]  # saturated red
    images[9, 1] = 7  # one constant channel
    images[10] = images[10] // 16 * 16  # few levels
    return images


def magnitudes(name: str, h: int, w: int) -> list[float]:
    """Every magnitude torchvision's spaces give `name` at (h, w), with both signs where it draws one."""
    values = {0.0}
    for space, bins in TV_SPACES.values():
        if name in space:
            table, signed = space[name]
            row = table(bins, h, w)
            if row is not None:
                values.update(float(v) for v in row)
                if signed:
                    values.update(-float(v) for v in row)
    if name == "Rotate":
        values.update([90.0, -90.0, 180.0, -180.0, 270.0, 360.0])  # torchvision's rot90 paths
    return sorted(values)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("name", D.OP_NAMES)
def test_each_operation_equals_torchvision_per_image_and_leaves_masked_out_images_alone(name, size):
    images = varied_images(*size)
    values = magnitudes(name, *size)
    n = len(images)
    rounds = max(3, math.ceil(len(values) / n) + 2)  # every magnitude on several images
    for r in range(rounds):
        m = torch.tensor([values[(r * n + 7 * i) % len(values)] for i in range(n)], dtype=torch.float64)
        mask = (torch.arange(n) + r) % 3 != 0
        out = D.apply_op(images, name, m, mask)
        assert out.dtype == torch.uint8 and out.shape == images.shape
        assert torch.equal(out[~mask], images[~mask])
        for i in mask.nonzero().flatten().tolist():
            expected = torchvision_op(images[i], name, float(m[i]))
            assert torch.equal(out[i], expected), (
                f"{name} magnitude {float(m[i])} image {i}: {int((out[i] != expected).sum())} pixels differ")


def test_the_operations_change_images():
    """The oracle is not vacuous: at these magnitudes every operation but Identity changes these images."""
    images = varied_images(32, 32)[[2, 6]]  # a gradient up to 254, a low-contrast image
    nonzero = {"ShearX": 0.3, "ShearY": -0.3, "TranslateX": 5.0, "TranslateY": -5.0, "Rotate": 30.0, "Brightness": 0.5,
               "Color": -0.5, "Contrast": 0.5, "Sharpness": 0.9, "Posterize": 4.0, "Solarize": 0.5}
    for name in D.OP_NAMES:
        m = torch.full((2,), nonzero.get(name, 0.0), dtype=torch.float64)
        changed = not torch.equal(D.apply_op(images, name, m, torch.ones(2, dtype=torch.bool)), images)
        assert changed == (name != "Identity"), name


@pytest.mark.parametrize("policy", ["autoaug", "randaug", "trivial"])
def test_magnitude_tables_are_torchvisions(policy):
    ours = {"autoaug": D.AUTO_AUGMENT_SPACE, "randaug": D.RAND_AUGMENT_SPACE,
            "trivial": D.TRIVIAL_AUGMENT_WIDE_SPACE}[policy]
    theirs, bins = TV_SPACES[policy]
    assert list(ours) == list(theirs)
    for name, (table, signed) in theirs.items():
        assert ours[name][1] == signed, name
        for h, w in SIZES:
            for n in (bins, 10, 31):
                expected, got = table(n, h, w), ours[name][0](n, h, w)
                assert (got is None) if expected is None else torch.equal(got, expected), name


def plan(policy: str, batch: int, h: int, w: int, seed: int) -> D.Plan:
    g = torch.Generator().manual_seed(seed)
    if policy in ("cifar10", "imagenet", "svhn"):
        return D.auto_augment_plan(batch, h, w, policy, g)
    if policy == "randaug":
        return D.rand_augment_plan(batch, h, w, 2, 9, g)
    if policy == "randaug-3-30":
        return D.rand_augment_plan(batch, h, w, 3, 30, g)
    return D.trivial_augment_wide_plan(batch, h, w, g)


def augment(policy: str, images: torch.Tensor, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if policy in ("cifar10", "imagenet", "svhn"):
        return D.auto_augment(images, policy, g)
    if policy == "randaug":
        return D.rand_augment(images, 2, 9, g)
    if policy == "randaug-3-30":
        return D.rand_augment(images, 3, 30, g)
    return D.trivial_augment_wide(images, g)


POLICIES = ["cifar10", "imagenet", "svhn", "randaug", "randaug-3-30", "trivial"]


@pytest.mark.parametrize("size", [(32, 32), (24, 16)], ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("policy", POLICIES)
def test_each_image_of_a_policy_is_torchvisions_operations_with_the_drawn_parameters(policy, size):
    images = torch.cat([varied_images(*size, seed=s) for s in range(3)])  # 96 images
    drawn = plan(policy, len(images), *size, seed=1)
    out = D.apply_plan(images, drawn)
    assert torch.equal(out, augment(policy, images, seed=1))  # the policy function is its plan, applied
    for i in range(len(images)):
        assert torch.equal(out[i], torchvision_plan(images[i], drawn, i)), f"{policy} image {i}"
    assert (out != images).flatten(1).any(1).float().mean() > 0.3


def expected_rates(policy: str, h: int, w: int) -> dict[tuple, float]:
    """From torchvision's definitions: the probability that an image runs operation `name` at unsigned
    magnitude `m` at `step`, per (step, name, m)."""
    rates: Counter = Counter()
    if policy in ("cifar10", "imagenet", "svhn"):
        space, bins = TV_SPACES["autoaug"]
        subs = v2.AutoAugment(v2.AutoAugmentPolicy(policy))._policies
        for sub in subs:
            for step, (name, p, level) in enumerate(sub):
                table = space[name][0](bins, h, w)
                rates[step, name, 0.0 if table is None else float(table[level])] += p / len(subs)
        return rates
    space, bins = TV_SPACES["randaug" if policy.startswith("randaug") else "trivial"]
    steps, level = {"randaug": (2, 9), "randaug-3-30": (3, 30), "trivial": (1, None)}[policy]
    for step in range(steps):
        for name, (table, _) in space.items():
            row = table(bins, h, w)
            for b in range(bins) if level is None else [level]:
                value = 0.0 if row is None else float(row[b])
                rates[step, name, value] += 1 / len(space) / (bins if level is None else 1)
    return rates


@pytest.mark.parametrize("policy", POLICIES)
def test_policies_draw_at_torchvisions_rates(policy):
    n, h, w = 20_000, 32, 32
    drawn = plan(policy, n, h, w, seed=3)
    seen = Counter()
    for step in range(drawn.ops.shape[1]):
        runs = drawn.applied[:, step]
        keys = zip(drawn.ops[runs, step].tolist(), drawn.magnitudes[runs, step].tolist())
        seen.update((step, D.OP_NAMES[op], m) for op, m in keys)
    expected = expected_rates(policy, h, w)
    assert set(seen) <= set(expected), set(seen) - set(expected)
    for key, p in expected.items():
        bound = 5 * math.sqrt(n * p * (1 - p))
        assert abs(seen[key] - n * p) <= bound, f"{key}: {seen[key]} times, expected {n * p:.0f} +- {bound:.0f}"
    signed = torch.tensor([D.OP_NAMES[op] in {"ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate", "Brightness",
                                              "Color", "Contrast", "Sharpness"} for op in drawn.ops.flatten().tolist()])
    signs = drawn.signs.flatten()
    assert (signs[~signed] == 1).all()
    negative, count = int((signs[signed] == -1).sum()), int(signed.sum())
    assert abs(negative - count / 2) <= 5 * math.sqrt(count / 4)


@pytest.mark.parametrize("policy", POLICIES)
def test_same_seed_same_images_other_seed_other_images(policy):
    images = varied_images(32, 32)
    first, again, other = (augment(policy, images, seed) for seed in (5, 5, 6))
    assert torch.equal(first, again)
    assert not torch.equal(first, other)


def test_refuses_what_is_not_a_uint8_rgb_batch():
    g = torch.Generator().manual_seed(0)
    with pytest.raises(ValueError, match="uint8"):
        D.trivial_augment_wide(torch.zeros(2, 3, 8, 8), g)
    with pytest.raises(ValueError, match="uint8"):
        D.trivial_augment_wide(torch.zeros(3, 8, 8, dtype=torch.uint8), g)
    with pytest.raises(ValueError, match="magnitude"):
        D.rand_augment(torch.zeros(2, 3, 8, 8, dtype=torch.uint8), 2, 31, g)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("policy", POLICIES)
def test_on_cuda_each_image_is_torchvisions_operations_on_cuda(policy):
    """On the GPU, against torchvision's kernels on the GPU (its blends are fused multiply-adds there too)."""
    images = torch.cat([varied_images(32, 32, seed=s) for s in range(3)]).cuda()
    g = torch.Generator(device="cuda").manual_seed(1)
    drawn = {"cifar10": lambda: D.auto_augment_plan(96, 32, 32, "cifar10", g),
             "imagenet": lambda: D.auto_augment_plan(96, 32, 32, "imagenet", g),
             "svhn": lambda: D.auto_augment_plan(96, 32, 32, "svhn", g),
             "randaug": lambda: D.rand_augment_plan(96, 32, 32, 2, 9, g),
             "randaug-3-30": lambda: D.rand_augment_plan(96, 32, 32, 3, 30, g),
             "trivial": lambda: D.trivial_augment_wide_plan(96, 32, 32, g)}[policy]()
    assert drawn.ops.device.type == "cuda"
    out = D.apply_plan(images, drawn)
    for i in range(len(images)):
        assert torch.equal(out[i], torchvision_plan(images[i], drawn, i)), f"{policy} image {i}"


@pytest.mark.parametrize("size", [(1, 1), (3, 3), (5, 5), (7, 9), (10, 10), (11, 13)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_contrast_equals_torchvision_at_sizes_that_leave_a_vector_tail(size):
    """3*H*W not a multiple of the CPU's vector length: torchvision's blend with the broadcast mean is not fused
    in the last partial vector, where a fused sum truncates one grey level apart (found on 3x3, 5x5, 7x9, 10x10
    among a few thousand random images; the vector length is the CPU's, so every tail length is tried)."""
    g = torch.Generator().manual_seed(2)
    values = sorted({v for name in ("Contrast",) for v in magnitudes(name, *size)})
    m = torch.tensor(values * 2, dtype=torch.float64)
    for _ in range(40):
        images = torch.randint(0, 256, (len(m), 3, *size), generator=g, dtype=torch.uint8)
        out = D.contrast(images, m)
        for i in range(len(m)):
            expected = torchvision_op(images[i], "Contrast", float(m[i]))
            assert torch.equal(out[i], expected), (
                f"Contrast magnitude {float(m[i])} at {size}: pixels {(out[i] != expected).flatten().nonzero().flatten().tolist()} differ")
