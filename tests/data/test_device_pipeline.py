"""Every aug option on the on-device pipeline (data/device/pipeline.py), on CPU tensors.

Each image of a device batch is what the loader path's transforms make of it with the same draws: the padded
crop and flip, the option's policy as torchvision's own operations with the plan's parameters
(`_apply_image_or_video_transform`, as test_device_ops.py's oracle), scaling and normalisation, then random
erasing on the normalised image (torchvision's `erase` with the drawn rectangle and noise). The plans are the
loader path's policy (`policy()`'s torchvision transform: its operations, bins and sub-policies). The draws are
a function of (seed, epoch, global batch, position): the same batch again, two processes' shares, a resumed
epoch, a resumed training run. Random erasing's rate and rectangles: torchvision's, within binomial bounds."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as TF

from helpers.configs import aug as aug_option
from helpers.configs import build_data, tiny_config
from helpers.kill_resume import stop_then_resume
from vit_train.data.device import ops as D
from vit_train.data.loaders import pipeline
from vit_train.data.device.pipeline import DeviceTrainPipeline, erasing_plan
from vit_train.data.sampler import EpochSampler
from vit_train.data.sources.shapes import SHAPES_STATS, generate_shapes
from vit_train.data.transforms import device_augmentation
from vit_train.errors import ConfigError
from vit_train.train.trainer import train

CPU = torch.device("cpu")
OPTIONS = ["none", "basic", "randaug", "autoaug", "trivial", "deit"]
REFERENCE = v2.AutoAugment()


def torchvision_plan(image: torch.Tensor, plan: D.Plan, i: int) -> torch.Tensor:
    """Image i's plan as torchvision's operations, one after the other (test_device_ops.py's oracle)."""
    for step in range(plan.ops.shape[1]):
        if plan.applied[i, step]:
            image = REFERENCE._apply_image_or_video_transform(
                image, D.OP_NAMES[plan.ops[i, step]], float(plan.signed_magnitudes()[i, step]),
                interpolation=v2.InterpolationMode.NEAREST, fill=REFERENCE._fill)
    return image


def loader_path(image: torch.Tensor, aug, draws, i: int, size: int, stats: tuple) -> torch.Tensor:
    """The loader path's transforms (aug/basic.py `train_transform`, transforms.py `build_transforms`) of one
    uint8 image with the device pipeline's draws for position i: Resize, RandomCrop(padding) and flip, the
    policy, ToDtype(scale) and Normalize, RandomErasing(value="random")."""
    if image.shape[-1] != size:
        image = TF.resize(image, [size], antialias=True)
    if draws.offsets is not None:
        pad = aug.padding(size)
        dy, dx = draws.offsets[i].tolist()
        image = TF.crop(TF.pad(image, [pad] * 4, fill=0), dy, dx, size, size)
        if draws.flips[i]:
            image = TF.horizontal_flip(image)
    if draws.plan is not None:
        image = torchvision_plan(image, draws.plan, i)
    x = TF.normalize(TF.to_dtype(image, torch.float32, scale=True), *stats)
    erasing = draws.erasing
    if erasing is not None and erasing.applied[i]:
        x = TF.erase(x, int(erasing.top[i]), int(erasing.left[i]), int(erasing.height[i]), int(erasing.width[i]),
                     erasing.values(i))
    return x


def assert_plan_is_the_loader_policy(plan: D.Plan, aug, size: int) -> None:
    """Every image's drawn operations and magnitudes are ones the option's loader policy (`policy(True)`,
    torchvision's transform) can draw: its number of operations, its bin, its sub-policies."""
    (policy,) = aug.policy(True)

    def value(space, name, bins, level):
        row = space[name][0](bins, size, size)
        return 0.0 if row is None else float(row[level])

    ops = [[D.OP_NAMES[o] for o in row] for row in plan.ops.tolist()]
    magnitudes = plan.magnitudes.tolist()
    if isinstance(policy, v2.AutoAugment):
        space = policy._AUGMENTATION_SPACE
        subs = {tuple((name, value(space, name, 10, level or 0)) for name, _, level in sub) for sub in policy._policies}
        for names, values in zip(ops, magnitudes):
            assert tuple(zip(names, values)) in subs
        assert (~plan.applied).any() and plan.applied.any()  # per-operation probabilities
    elif isinstance(policy, v2.RandAugment):
        space, bins = policy._AUGMENTATION_SPACE, policy.num_magnitude_bins
        assert plan.ops.shape[1] == policy.num_ops and plan.applied.all()
        for names, values in zip(ops, magnitudes):
            assert values == [value(space, name, bins, policy.magnitude) for name in names]
    else:
        assert isinstance(policy, v2.TrivialAugmentWide)
        space, bins = policy._AUGMENTATION_SPACE, policy.num_magnitude_bins
        assert plan.ops.shape[1] == 1 and plan.applied.all()
        for names, values in zip(ops, magnitudes):
            assert values[0] in {value(space, names[0], bins, b) for b in range(bins)}
    assert len({tuple(r) for r in ops}) > 1  # images draw their own operations


def device_batches(aug, native: int = 16, size: int = 16, batch_size: int = 16, count: int = 64, repeats: int = 1,
                   rank: int = 0, world_size: int = 1, epoch: int = 0, start: int = 0):
    """(pipeline, source images, [(batch, labels), ...]) of shapes images at side `native`, labels = indices."""
    images, _ = generate_shapes(count, native, seed=3)
    sampler = EpochSampler(count, seed=5, repeats=repeats, batch_size=batch_size, rank=rank, world_size=world_size)
    sampler.set_epoch(epoch, start)
    device = DeviceTrainPipeline(images, torch.arange(count), sampler, aug, size, SHAPES_STATS, CPU)
    return device, images, [(x.clone(), y.clone()) for x, y in device]


CASES = [(name, {}, native) for native in (16, 32, 12) for name in OPTIONS] + [  # at, above and below the model's side
    ("basic", {"random_erasing": 0.5}, 16),
    ("none", {"random_erasing": 0.5}, 16),
    ("randaug", {"randaug_n": 3, "randaug_m": 20, "random_erasing": 0.3}, 16),
    ("autoaug", {"autoaug_policy": "svhn"}, 16),
    ("trivial", {"random_erasing": 1.0}, 32),
]


@pytest.mark.parametrize("name, keys, native", CASES,
                         ids=[f"{n}-{'-'.join(f'{k}={v}' for k, v in keys.items()) or 'defaults'}-{s}px"
                              for n, keys, s in CASES])
def test_each_device_image_is_the_loader_paths_transforms_with_the_same_draws(name, keys, native):
    aug = aug_option(name, **keys)
    assert device_augmentation(aug) is None  # every option runs on the device pipeline
    pipe, images, batches = device_batches(aug, native=native)
    assert len(batches) == 4
    erased = 0
    for b, (x, index) in enumerate(batches):
        draws = pipe.draws(b)
        assert (draws.offsets is None) == (name == "none")
        assert (draws.plan is None) == (name in ("none", "basic"))
        assert (draws.erasing is None) == (aug.random_erasing == 0)
        if draws.plan is not None:
            assert_plan_is_the_loader_policy(draws.plan, aug, 16)
        if draws.erasing is not None:
            erased += int(draws.erasing.applied.sum())
        assert x.shape == (16, 3, 16, 16) and x.dtype == torch.float32
        for i, k in enumerate(index.tolist()):
            expected = loader_path(images[k], aug, draws, i, 16, SHAPES_STATS)
            torch.testing.assert_close(x[i], expected, rtol=0, atol=1e-5,
                                       msg=lambda m: f"batch {b} image {i}: {m}")
    if aug.random_erasing:
        assert 0 < erased <= 64 and (erased == 64) == (aug.random_erasing == 1.0)


def test_the_policy_changes_the_images_basic_does_not_draw_differently():
    """Not vacuous: a policy's images differ from aug=basic's, whose crop and flip are drawn first and alike;
    aug=basic's batches are those of the crop and flip alone (the draws it always made)."""
    _, _, basic = device_batches(aug_option("basic"))
    for name in ("randaug", "autoaug", "trivial", "deit"):
        pipe, _, policy = device_batches(aug_option(name))
        assert torch.equal(pipe.draws(0).offsets, device_batches(aug_option("basic"))[0].draws(0).offsets)
        changed = torch.cat([(p[0] != q[0]).flatten(1).any(1) for p, q in zip(policy, basic)])
        assert changed.float().mean() > 0.3, name


@pytest.mark.parametrize("name", ["deit", "autoaug"])
def test_the_same_batch_again_and_two_processes_shares_are_one_processes_batch(name):
    aug = aug_option(name)
    _, _, one = device_batches(aug, epoch=1)
    _, _, again = device_batches(aug, epoch=1)
    _, _, other_epoch = device_batches(aug, epoch=2)
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(one, again))
    assert not torch.equal(one[0][0], other_epoch[0][0])
    shares = [device_batches(aug, epoch=1, rank=r, world_size=2)[2] for r in range(2)]
    for b, (x, y) in enumerate(one):
        assert torch.equal(torch.cat([shares[0][b][0], shares[1][b][0]]), x)
        assert torch.equal(torch.cat([shares[0][b][1], shares[1][b][1]]), y)
    _, _, resumed = device_batches(aug, epoch=1, start=2 * 16)  # two global batches done
    assert len(resumed) == 2
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(one[2:], resumed))


def test_two_processes_of_a_run_see_what_one_would(make_config):
    cfg = make_config(data={"pipeline": "device"}, aug={"name": "deit"})
    batches = []
    for rank, world in ((0, 1), (0, 2), (1, 2)):
        data = build_data(cfg, CPU, rank, world)
        data.train_sampler.set_epoch(1)
        batches.append([(x.clone(), y.clone()) for x, y in data.train_loader])
    for (x, y), (x0, y0), (x1, y1) in zip(*batches):
        assert torch.equal(torch.cat([x0, x1]), x) and torch.equal(torch.cat([y0, y1]), y)


def test_repeated_augmentation_gives_each_copy_its_own_draws():
    """data.repeated_aug: the sampler puts an image's copies at consecutive positions of the epoch; each position
    has its own draws, so the copies are augmented differently (and each is the loader path's with its draws)."""
    aug = aug_option("deit", mixup_alpha=0.0, cutmix_alpha=0.0)
    pipe, images, batches = device_batches(aug, repeats=2)
    pairs = differ = 0
    for b, (x, index) in enumerate(batches):
        assert torch.equal(index[0::2], index[1::2])  # copies in a row, within a global batch
        pairs += len(index) // 2
        differ += int((x[0::2] != x[1::2]).flatten(1).any(1).sum())
        draws = pipe.draws(b)
        for i, k in enumerate(index.tolist()):
            torch.testing.assert_close(x[i], loader_path(images[k], aug, draws, i, 16, SHAPES_STATS), rtol=0, atol=1e-5)
    assert differ >= 0.9 * pairs


def test_auto_keeps_shapes_on_the_device_whatever_the_option_and_a_users_own_policy_is_refused(make_config):
    from helpers.registry import registry_kept
    from vit_train.data.aug.randaug import RandAug

    splits = make_config().data.splits(16)
    for name in OPTIONS:
        for erasing in (0.0, 0.25):
            cfg = make_config(data={"pipeline": "auto"}, aug={"name": name, "random_erasing": erasing})
            assert pipeline(cfg, torch.device("cuda"), splits) == "device", (name, erasing)
            assert pipeline(cfg, CPU, splits) == "loader"
    with registry_kept():
        @dataclass
        class Posterized(RandAug):  # a user's policy on RandAug's crop and flip, keeping RandAug's flag
            name: str = "posterized"

            def policy(self, small_images):
                return [v2.RandomPosterize(2, p=1.0)]

        cfg = make_config(data={"pipeline": "device"}, aug={"name": "posterized"})
        with pytest.raises(ConfigError, match="aug=posterized's transform is done by the loader only"):
            build_data(cfg, CPU)
        auto = make_config(data={"pipeline": "auto"}, aug={"name": "posterized"})
        assert pipeline(auto, torch.device("cuda"), splits) == "loader"


def test_random_erasing_draws_at_its_rate_with_torchvisions_rectangles():
    n, size, p = 20_000, 32, 0.25
    drawn = erasing_plan(n, size, p, torch.Generator().manual_seed(0))
    rate = drawn.applied.float().mean().item()
    # with a 32 side all 10 tries fail with a probability below 1e-10: the rate is p
    assert abs(rate - p) <= 5 * math.sqrt(p * (1 - p) / n)
    h, w = drawn.height[drawn.applied], drawn.width[drawn.applied]
    top, left = drawn.top[drawn.applied], drawn.left[drawn.applied]
    assert ((h >= 1) & (h < size) & (w >= 1) & (w < size)).all()
    assert ((top >= 0) & (top + h <= size) & (left >= 0) & (left + w <= size)).all()
    assert (drawn.height[~drawn.applied] == 0).all() and len(drawn.noise) == int((3 * h * w).sum())
    assert abs(drawn.noise.mean().item()) < 0.01 and abs(drawn.noise.std().item() - 1) < 0.01
    # the rectangles' distribution is torchvision's: area share, side and position means within 5 standard errors
    torch.manual_seed(0)
    erasing = v2.RandomErasing(p=1.0, value="random")
    theirs = [erasing.make_params([torch.zeros(3, size, size)]) for _ in range(4000)]
    theirs = torch.tensor([[q["h"], q["w"], q["i"], q["j"]] for q in theirs if q["v"] is not None], dtype=torch.float64)
    ours = torch.stack([h, w, top, left], 1).double()
    for column, what in enumerate(("height", "width", "top", "left")):
        a, b = ours[:, column], theirs[:, column]
        error = math.sqrt(a.var() / len(a) + b.var() / len(b))
        assert abs(a.mean() - b.mean()) <= 5 * error, what
    area_ours, area_theirs = (ours[:, 0] * ours[:, 1]), (theirs[:, 0] * theirs[:, 1])
    error = math.sqrt(area_ours.var() / len(area_ours) + area_theirs.var() / len(area_theirs))
    assert abs(area_ours.mean() - area_theirs.mean()) <= 5 * error
    # through the pipeline: the share of erased images of a whole epoch
    pipe, _, _ = device_batches(aug_option("basic", random_erasing=p), batch_size=64, count=64 * 40)
    applied = torch.cat([pipe.draws(b).erasing.applied for b in range(40)]).float()
    assert abs(applied.mean().item() - p) <= 5 * math.sqrt(p * (1 - p) / len(applied))


DEIT = {"data": {"pipeline": "device", "repeated_aug": 2}, "aug": {"name": "deit"},
        "model": {"dropout": 0.1, "drop_path": 0.2}}


def test_a_deit_run_on_the_device_resumed_mid_epoch_equals_the_uninterrupted_run(tmp_path):
    """aug=deit on the device pipeline (RandAugment, random erasing, MixUp/CutMix, repeated augmentation): a run
    resumed from its step-5 checkpoint (8 steps an epoch: mid-epoch) ends as the uninterrupted one, bit for bit."""
    sections = dict(DEIT, trainer={"ckpt_every": 1, "keep_last": 100})
    train(tiny_config(**sections), tmp_path / "full")
    train(tiny_config(**sections, resume=str(tmp_path / "full" / "checkpoints" / "step_00000005.pt")),
          tmp_path / "resumed")
    expected = torch.load(tmp_path / "full" / "checkpoints" / "last.pt", weights_only=True)["model"]
    got = torch.load(tmp_path / "resumed" / "checkpoints" / "last.pt", weights_only=True)["model"]
    assert expected.keys() == got.keys() and all(torch.equal(expected[k], got[k]) for k in expected)


@pytest.mark.slow
def test_a_deit_run_on_the_device_killed_mid_epoch_resumes_as_the_uninterrupted_run(tmp_path):
    """As test_resume_matrix.py's cells: kill -9 after the 11th train row (epoch 2, step 3 of 8), resume=auto."""
    plain = {**DEIT, "data": {**DEIT["data"], "batch_size": 8, "train_size": 64, "val_size": 16},
             "trainer": {"epochs": 2, "log_every": 1, "ckpt_every": 5, "keep_last": 1}}
    reference = tmp_path / "reference"
    train(tiny_config(**plain), reference)
    stop_then_resume(tmp_path / "stopped", plain, reference, "KILL")
