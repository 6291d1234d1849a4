"""Loader speed of the same images as an image folder, as WebDataset shards (vit-shards) and as a Hugging Face
dataset (save_to_disk), with the same transforms and workers; the time to resume at 90% of an epoch; the
sizes on disk (docs/data.md, "Loader speed: folder, shards, Hugging Face").

The images are JPEGs written by the script (--images, --size 160x120, 10 classes, random blocks so they do not
compress to nothing) into a temporary folder, or a folder given with --folder (root/train/<class>/*,
root/val/<class>/*). The same files become shards (image_format=source: their bytes, unchanged), pre-resized
shards for each --short-side N (vit-shards short_side=N) and a save_to_disk dataset (an Image column of the same
bytes). With --workers 0 the main process decodes: images/s is then one core's rate. Each data set's training loader (its `build`, as a
run builds it: aug=basic, RandomResizedCrop to --img-size, the same --workers) is run for one epoch
(--epochs-fraction of it), images/s counted from the first batch's arrival to the last (start-up apart),
the three in turn for --rounds rounds, medians given.
The resume time is from set_epoch at 90% of the epoch to the first batch. Prints a Markdown table, the CPU
and the load averages.

    python scripts/bench_data.py                           # 2000 JPEGs, 2 workers, batch 64
    python scripts/bench_data.py --folder /data/pets --workers 8
    python scripts/bench_data.py --size 500x375 --short-side 256 --short-side 160 --workers 0 --no-hf
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from vit_train.config import Config
from vit_train.tools.shards import write_shards

CLASSES = 10


def write_jpegs(root: Path, count: int, size: tuple[int, int] = (160, 120)) -> None:
    """`count` training JPEGs (and a tenth as many val ones) of `size` (W, H) in 10 class folders."""
    rng = np.random.default_rng(0)
    for split, n in (("train", count), ("val", max(CLASSES, count // 10))):
        for i in range(n):
            folder = root / split / f"class{i % CLASSES}"
            folder.mkdir(parents=True, exist_ok=True)
            blocks = rng.integers(0, 256, (-(-size[1] // 8), -(-size[0] // 8), 3), dtype=np.uint8)
            picture = np.kron(blocks, np.ones((8, 8, 1), np.uint8))[:size[1], :size[0]] + \
                rng.integers(0, 24, (size[1], size[0], 3), dtype=np.uint8)
            Image.fromarray(picture).save(folder / f"{i:06d}.jpg", quality=90)


def write_hf(folder: Path, out: Path) -> None:
    """The image folder's files as a save_to_disk DatasetDict (train, validation) with a ClassLabel."""
    import datasets

    from vit_train.data.sources.imagefolder_files import load_image_folders

    datasets.disable_progress_bars()

    train, val, names = load_image_folders(folder)
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=names)})
    parts = {split: datasets.Dataset.from_dict(
        {"image": [{"bytes": Path(p).read_bytes(), "path": None} for p, _ in base.samples],
         "label": [label for _, label in base.samples]}, features=features)
        for split, base in (("train", train), ("validation", val))}
    datasets.DatasetDict(parts).save_to_disk(str(out))


def config(name: str, root: Path, args) -> Config:
    stream = {"shuffle_buffer": args.shuffle_buffer} if name == "webdataset" else {}  # data=webdataset's own key
    return Config.from_dict({"data": {"name": name, "root": str(root), "batch_size": args.batch,
                                      "num_workers": args.workers, **stream},
                             "model": {"img_size": args.img_size}, "aug": {"name": "basic"},
                             "trainer": {"device": "cpu", "progress": False}})


def measure(name: str, root: Path, args) -> dict:
    """images/s over one epoch of the training loader (from the first batch), and the resume time."""
    cfg = config(name, root, args)
    data = cfg.data.build(cfg, torch.device("cpu"))
    sampler, loader = data.train_sampler, data.train_loader
    epoch_size = data.steps_per_epoch * args.batch
    sampler.set_epoch(0)
    started = time.perf_counter()
    first, images = None, 0
    for i, (x, _) in enumerate(loader):
        if first is None:
            first = time.perf_counter()
        else:
            images += len(x)
        if i + 1 >= data.steps_per_epoch * args.epochs_fraction:
            break
    rate = images / (time.perf_counter() - first)
    start_up = first - started
    resume_at = int(epoch_size * 0.9) // args.batch * args.batch
    sampler.set_epoch(1, start=resume_at)
    began = time.perf_counter()
    next(iter(loader))
    resume = time.perf_counter() - began
    sampler.set_epoch(1)
    began = time.perf_counter()
    next(iter(loader))
    fresh = time.perf_counter() - began
    return {"rate": rate, "start_up": start_up, "resume": resume, "fresh": fresh, "at": resume_at}


def size_of(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def cpu_model() -> str:
    try:
        lines = subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines()
        return next(line.split(":", 1)[1].strip() for line in lines if line.startswith("Model name"))
    except (OSError, StopIteration):
        return platform.processor() or "unknown CPU"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--folder", type=Path, help="an image folder (root/train/<class>/*); default: JPEGs written here")
    parser.add_argument("--images", type=int, default=2000, help="training JPEGs to write (without --folder)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--img-size", type=int, default=224)
    parser.add_argument("--shuffle-buffer", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3, help="the data sets measured in turn, this many times; medians")
    parser.add_argument("--epochs-fraction", type=float, default=1.0, help="the share of the epoch timed")
    parser.add_argument("--size", default="160x120", help="WxH of the JPEGs written (without --folder)")
    parser.add_argument("--short-side", type=int, action="append", default=[],
                        help="also shards pre-resized to this shorter side (vit-shards short_side=N); repeatable")
    parser.add_argument("--no-hf", action="store_true", help="leave the Hugging Face dataset out")
    args = parser.parse_args()
    width, height = (int(v) for v in args.size.lower().split("x"))
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(1)
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench-data-") as tmp:
        tmp = Path(tmp)
        folder = args.folder or tmp / "folder"
        if args.folder is None:
            write_jpegs(folder, args.images, (width, height))
        began = time.perf_counter()
        index = write_shards(config("imagefolder", folder, args), tmp / "shards", ["train", "val"], progress=False)
        shard_time = time.perf_counter() - began
        # row -> (data set, root)
        roots = {"imagefolder": ("imagefolder", folder), "webdataset": ("webdataset", tmp / "shards")}
        for side in args.short_side:
            out = tmp / f"shards-{side}"
            write_shards(config("imagefolder", folder, args), out, ["train", "val"], progress=False, short_side=side)
            roots[f"webdataset short_side={side}"] = ("webdataset", out)
        if not args.no_hf:
            write_hf(folder, tmp / "hf")
            roots["hf"] = ("hf", tmp / "hf")
        rounds = [{row: measure(name, root, args) for row, (name, root) in roots.items()} for _ in range(args.rounds)]
        results = {row: {k: statistics.median(r[row][k] for r in rounds) for k in rounds[0][row]} for row in roots}
        sizes = {row: size_of(root) for row, (_, root) in roots.items()}
    base = results["imagefolder"]["rate"]
    train_images = index["splits"]["train"]["samples"]
    written = f"written: {width}x{height} JPEGs" if args.folder is None else args.folder
    cores = "1 core: the main process decodes" if args.workers == 0 else f"{args.workers} loader workers"
    print(f"{train_images} training images ({written}), batch {args.batch}, {cores}, aug=basic to "
          f"{args.img_size}x{args.img_size}, shuffle buffer {args.shuffle_buffer}; medians of {args.rounds} rounds\n")
    print("| data | images/s | per core | vs folder | start-up s | resume at 90%: first batch s "
          "| fresh epoch: first batch s | size on disk | vs folder |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, r in results.items():
        print(f"| {name} | {r['rate']:.0f} | {r['rate'] / max(1, args.workers):.0f} | {r['rate'] / base:.2f} | "
              f"{r['start_up']:.2f} | {r['resume']:.2f} | {r['fresh']:.2f} | {sizes[name] / 2**20:.1f} MiB | "
              f"{sizes[name] / sizes['imagefolder']:.3f} |")
    print(f"\nvit-shards wrote {train_images} + {index['splits']['val']['samples']} images in {shard_time:.1f} s "
          f"({(train_images + index['splits']['val']['samples']) / shard_time:.0f} images/s, one process)")
    print(f"CPU: {cpu_model()}, {os.cpu_count()} cores; load average before {load_before[0]:.2f}, "
          f"after {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
