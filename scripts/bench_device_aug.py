"""Speed of the batched per-image policies (vit_train/data/device/ops.py) against torchvision's per-image v2
transforms with the same policy, on the same images, in one process: AutoAugment (CIFAR-10 policy),
RandAugment(2, 9) and TrivialAugmentWide on a batch of uint8 images (default 256 of 32x32, random).

Each side augments the whole batch --repeats times after one warm-up pass (torchvision: a loop over the
images; device_ops: one call), the two sides taking turns; the median time gives images/s. On CUDA both run on the GPU, synchronised
before each clock. Prints one Markdown table with the ratio (batched / per-image).

    python scripts/bench_device_aug.py                    # CPU
    python scripts/bench_device_aug.py --device cuda --batch 1024
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Callable

import torch
from torchvision.transforms import v2

from vit_train.data.device import ops as device_ops


def clock(step: Callable[[], object], device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def seconds(per_image: Callable[[], object], batched: Callable[[], object], device: torch.device,
            repeats: int) -> tuple[float, float]:
    """Median wall times of the two sides, after one warm-up run each, the sides taking turns so that
    both see the same load on a shared machine."""
    clock(per_image, device), clock(batched, device)
    times = [(clock(per_image, device), clock(batched, device)) for _ in range(repeats)]
    return statistics.median(t for t, _ in times), statistics.median(t for _, t in times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--batch", type=int, default=256, help="images per batch")
    parser.add_argument("--size", type=int, default=32, help="image side in pixels")
    parser.add_argument("--repeats", type=int, default=5, help="timed passes per side (median)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device")
    torch.manual_seed(args.seed)
    images = torch.randint(0, 256, (args.batch, 3, args.size, args.size), dtype=torch.uint8).to(device)
    generator = torch.Generator(device=device).manual_seed(args.seed)

    policies = [
        ("AutoAugment cifar10", v2.AutoAugment(v2.AutoAugmentPolicy.CIFAR10),
         lambda: device_ops.auto_augment(images, "cifar10", generator)),
        ("RandAugment(2, 9)", v2.RandAugment(num_ops=2, magnitude=9),
         lambda: device_ops.rand_augment(images, 2, 9, generator)),
        ("TrivialAugmentWide", v2.TrivialAugmentWide(), lambda: device_ops.trivial_augment_wide(images, generator)),
    ]
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    print(f"{args.batch} images of 3x{args.size}x{args.size} uint8 on {where}; torch {torch.__version__}; "
          f"median of {args.repeats}")
    print()
    print("| policy | torchvision per image (images/s) | device_ops batched (images/s) | ratio |")
    print("|---|---:|---:|---:|")
    for name, transform, batched in policies:
        per_image, together = seconds(lambda: [transform(image) for image in images], batched, device, args.repeats)
        rates = f"{args.batch / per_image:,.0f} | {args.batch / together:,.0f}"
        print(f"| {name} | {rates} | {per_image / together:.1f}x |")


if __name__ == "__main__":
    main()
