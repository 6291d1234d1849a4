"""Part: JPEG decoding on the GPU (data.decode=gpu) against the loader workers (data.decode=cpu).

A folder of generated photo-like JPEGs (500x375, quality 90, 4:2:0: noise and edges, ~100 KB each as ImageNet's
are) read at 224 with DeiT's augmentation (aug=deit), as vit-train builds the loaders: images/s of decode=gpu
(workers read bytes; nvJPEG decodes each batch; crop, flip, RandAugment, normalisation and erasing on the GPU) and
of decode=cpu (16 workers decode and augment), beside ViT-S/16's compiled training rate (the throughput part's;
the report divides). Where decode=gpu's time goes: the workers' bytes alone, then with decoding, then whole.
nvJPEG's pixels against the CPU decoder's (data/decoding/image.py) on photos and on every subsampling, progressive, grey
and EXIF-rotated files: the tolerance. The fallbacks counted on a folder holding CMYK, progressive, PNG-named-.jpg
and truncated files. Every figure is written when measured: a part stopped at the end of its box keeps them.
"""

from __future__ import annotations

import io
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import torch

from vit_train.config import Config
from vit_train.data.decoding import image as cpu_decoder
from vit_train.data.decoding.batched import CHECK_MEAN_DIFF, BatchDecoder, collate, encode

from .record import Recorder

SIZES = {
    "gpu": dict(jpegs=4000, size=(500, 375), batch=256, workers=16, seconds=14, stage_seconds=5, compare=192),
    "smoke": dict(jpegs=48, size=(50, 38), batch=8, workers=2, seconds=4, stage_seconds=2, compare=8),
}
CLASSES = 10


def run_decode(rec: Recorder) -> None:
    s = SIZES["smoke" if rec.smoke else "gpu"]
    device = torch.device(rec.device)
    folder, seconds = write_photos(rec.work / "jpegs", s["jpegs"], s["size"], s["workers"])
    rec.figure("folder_seconds", seconds, "s", f"writing {s['jpegs']} photo-like JPEGs of {s['size'][0]}x"
               f"{s['size'][1]} ({mean_kb(folder):.0f} KB on average)")
    tolerance(rec, folder, device, s)
    fallbacks(rec, device)
    label = f"{s['size'][0]}x{s['size'][1]} JPEG folder at 224, aug=deit, batch {s['batch']}, {s['workers']} workers"
    for mode, what in (("gpu", "data.decode=gpu (nvJPEG, augmented on the device)" if rec.cuda else
                        "data.decode=gpu (its device=cpu path)"), ("cpu", "data.decode=cpu (loader workers)")):
        if rec.left() < s["seconds"] + 10:
            rec.note(f"{mode}: not measured, {rec.left():.0f} s left")
            continue
        rate = feed_rate(build(folder, mode, device, s), device, s["seconds"])
        rec.figure(f"{mode}.images_per_s", rate, "img/s", f"{label}: {what}")
    gpu, cpu = (rec.data["figures"].get(f"{m}.images_per_s", {}).get("value") for m in ("gpu", "cpu"))
    if gpu and cpu:
        rec.figure("gpu_over_cpu", gpu / cpu, "x", "decode=gpu / decode=cpu images/s")
    if rec.left() > 2 * s["stage_seconds"] + 10:
        stages(rec, folder, device, s)


def photo(job: tuple) -> None:
    """Write one worker's share of photo-like JPEGs (PIL and numpy only: no torch in the workers)."""
    from PIL import Image

    root, first, count, (width, height) = job
    for i in range(first, first + count):
        rng = np.random.default_rng(i)
        y, x = np.mgrid[0:height, 0:width]
        base = np.stack([x * 255 / width, y * 255 / height, 128 + 100 * np.sin(x / 17 + i)], -1)
        for _ in range(6):
            top, left = rng.integers(0, height), rng.integers(0, width)
            base[top:top + height // 5, left:left + width // 5] = rng.integers(0, 256, 3)
        pixels = np.clip(base + rng.normal(0, 14, base.shape), 0, 255).astype(np.uint8)
        split = "val" if i % 25 == 24 else "train"
        Image.fromarray(pixels).save(root / split / f"c{i % CLASSES}" / f"{i:06d}.jpg", quality=90)


def write_photos(root: Path, count: int, size: tuple[int, int], workers: int) -> tuple[Path, float]:
    """root/{train,val}/c<k>/*.jpg, `count` photo-like JPEGs (every 25th in val/); (root, seconds; 0 when there)."""
    if (root / ".complete").exists():
        return root, 0.0
    start = time.time()
    for split in ("train", "val"):
        for k in range(CLASSES):
            (root / split / f"c{k}").mkdir(parents=True, exist_ok=True)
    step = -(-count // max(workers, 1))
    with ProcessPoolExecutor(max(workers, 1)) as pool:
        list(pool.map(photo, [(root, first, min(step, count - first), size) for first in range(0, count, step)]))
    (root / ".complete").touch()
    return root, time.time() - start


def mean_kb(folder: Path) -> float:
    sizes = [p.stat().st_size for p in folder.glob("train/*/*.jpg")]
    return sum(sizes) / max(len(sizes), 1) / 1024


def build(root: Path, mode: str, device: torch.device, s: dict, aug: str = "deit", batch: int | None = None):
    cfg = Config.from_dict({"data": {"name": "imagefolder", "root": str(root), "batch_size": batch or s["batch"],
                                     "num_workers": s["workers"], "decode": mode, "max_bad_fraction": 0.5},
                            "model": {"img_size": 224, "patch_size": 16}, "aug": {"name": aug},
                            "trainer": {"device": device.type}})
    return cfg.data.build(cfg, device)


def feed_rate(data, device: torch.device, seconds: float, loader=None, step=None) -> float:
    """Images/s of `loader` (default: the training loader; `step` applied to each batch) after its first batch
    (worker start-up), over epochs until `seconds` have passed; images on `device` and waited for."""
    loader = loader if loader is not None else data.train_loader
    seen, start, epoch = 0, None, 0
    while start is None or time.perf_counter() - start < seconds:
        data.train_sampler.set_epoch(epoch)
        for batch in loader:
            images = step(batch) if step else batch[0].to(device, non_blocking=True)
            if start is None:
                start = time.perf_counter()
                continue
            seen += len(images)
            if time.perf_counter() - start > seconds:
                break
        epoch += 1
    if device.type == "cuda":
        torch.cuda.synchronize()
    return seen / (time.perf_counter() - start)


def stages(rec: Recorder, root: Path, device: torch.device, s: dict) -> None:
    """decode=gpu's stages: the workers' encoded batches alone, then decoded on the device (no augmentation)."""
    data = build(root, "gpu", device, s)
    raw = data.train_loader.loader  # the CheckedLoader of (EncodedBatch, labels)
    decoder = BatchDecoder(device, "train")
    rec.figure("gpu.bytes_images_per_s", feed_rate(data, device, s["stage_seconds"], raw, lambda b: b[1]), "img/s",
               "decode=gpu stages: the workers' bytes only")
    rec.figure("gpu.decoded_images_per_s", feed_rate(data, device, s["stage_seconds"], raw, lambda b: decoder(b[0])),
               "img/s", "decode=gpu stages: bytes and the batched decode (no crop or augmentation)")


def tolerance(rec: Recorder, root: Path, device: torch.device, s: dict) -> None:
    """The batched decoder's pixels (nvJPEG on a GPU) against the CPU decoder's, upright, per file kind."""
    from PIL import Image

    files = sorted(root.glob("train/*/*.jpg"))[:s["compare"]]
    made = {}
    picture = np.asarray(Image.open(files[0]).convert("RGB"))
    exif = Image.Exif()
    exif[0x0112] = 6
    for name, options in (("444", dict(subsampling=0)), ("422", dict(subsampling=1)), ("q75", dict(quality=75)),
                          ("progressive", dict(progressive=True)), ("exif6", dict(exif=exif.tobytes()))):
        out = io.BytesIO()
        Image.fromarray(picture).save(out, format="JPEG", **options)
        made[name] = out.getvalue()
    out = io.BytesIO()
    Image.fromarray(picture).convert("L").save(out, format="JPEG")
    made["grey"] = out.getvalue()
    sets = {"photos": [(p.read_bytes(), str(p)) for p in files], **{k: [(v, k)] for k, v in made.items()}}
    worst, means = {}, {}
    for name, items in sets.items():
        decoder = BatchDecoder(device, "train")
        images = decoder(collate([(encode(data, where), 0, -1) for data, where in items])[0])
        diffs = [difference(image, data, where) for image, (data, where) in zip(images, items)]
        d = torch.cat(diffs).float()
        worst[name], means[name] = d.max().item(), d.mean().item()
        if name == "photos":
            rec.figure("tolerance.max_levels", worst[name], "levels", f"batched decoder vs CPU decoder, "
                       f"{len(items)} photos: largest difference (0-255 levels)")
            rec.figure("tolerance.mean_levels", means[name], "levels", "batched vs CPU decoder: mean difference")
            rec.figure("tolerance.p999_levels", torch.quantile(d[:1_000_000], 0.999).item(), "levels",
                       "batched vs CPU decoder: 99.9th percentile")
    kinds = ", ".join(f"{k} {worst[k]:.0f} (mean {means[k]:.2f})" for k in worst if k != "photos")
    rec.figure("tolerance.kinds_max_levels", max(worst.values()), "levels", "batched vs CPU decoder: largest "
               "difference over 4:4:4, 4:2:2, q75, progressive, EXIF-rotated and grey files", detail=kinds)
    rec.check("tolerance_kinds", all(m <= CHECK_MEAN_DIFF for m in means.values()), "every kind decodes to the CPU "
              f"decoder's picture (mean difference <= {CHECK_MEAN_DIFF} levels: no turned, grey-as-colour or garbled "
              "image)", kinds)


def difference(image: torch.Tensor, data: bytes, where: str) -> torch.Tensor:
    """|batched decode - CPU decoder| per value, 0-255 levels; a picture of another shape (turned) counts 255."""
    expected = torch.from_numpy(np.asarray(cpu_decoder.decode_rgb(data, where)).copy()).permute(2, 0, 1).int()
    if image is None or tuple(image.shape) != tuple(expected.shape):
        return torch.full((1,), 255)
    return (image.cpu().int() - expected).abs().flatten()


def fallbacks(rec: Recorder, device: torch.device) -> None:
    """A folder of JPEGs with CMYK, progressive, PNG-named-.jpg and truncated files: one epoch with decode=gpu."""
    from PIL import Image

    root, written = rec.work / "kinds", {"CMYK/YCCK JPEG": 2, "progressive JPEG": 2, "PNG": 2, "truncated": 2}
    for k in range(2):
        (root / "train" / f"c{k}").mkdir(parents=True, exist_ok=True)
        (root / "val" / f"c{k}").mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for i in range(16):
        image = Image.fromarray(rng.integers(0, 256, (48, 64, 3), dtype=np.uint8))
        folder = root / "train" / f"c{i % 2}"
        kind = ["CMYK/YCCK JPEG", "progressive JPEG", "PNG", "truncated"][i // 2] if i < 8 else "JPEG"
        out = io.BytesIO()
        if kind == "CMYK/YCCK JPEG":
            image.convert("CMYK").save(out, format="JPEG")
        else:
            image.save(out, format="PNG" if kind == "PNG" else "JPEG", progressive=kind == "progressive JPEG")
        data = out.getvalue()
        (folder / f"{i:02d}.jpg").write_bytes(data[:len(data) // 2] if kind == "truncated" else data)
        if i < 2:
            image.save(root / "val" / f"c{i % 2}" / f"{i}.jpg")
    data = build(root, "gpu", device, dict(workers=2, batch=8), aug="deit")
    data.train_sampler.set_epoch(0)
    images = sum(len(x) for x, _ in data.train_loader)
    counts, unreadable = dict(data.decoder.counts), len(data.train_unreadable.seen)
    said = ", ".join(f"{n} {k}" for k, n in counts.items()) + f"; {unreadable} unreadable"
    rec.figure("fallbacks", sum(n for k, n in counts.items() if k not in ("JPEG", "progressive JPEG")), "images",
               "fallbacks counted in one epoch of a 16-file folder", detail=said)
    ok = images == 16 and unreadable == written["truncated"] and all(
        counts.get(kind, 0) >= n for kind, n in written.items() if kind != "truncated")
    rec.check("fallbacks_counted", ok, "CMYK, progressive, PNG-named-.jpg files counted by kind; truncated ones "
              "unreadable (data.bad_images=skip); the epoch whole", f"{images} images; {said}")
