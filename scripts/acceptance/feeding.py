"""Parts 3 and 4: feeding the GPU.

data: CIFAR-shaped uint8 images through the on-device pipeline (aug=basic) and through the
DataLoader with many workers (scripts/benchmark.py's pipeline measurement); the data-wait share of
a short ViT-Ti/4 vit-train run with each; an image folder of generated JPEGs through the loader at
224 (the data set's `build`, as vit-train builds it).

e2e: the cifar10_vit_tiny recipe on a CIFAR-format folder of generated images, for as many
epochs as its time allows (then SIGTERM: vit-train checkpoints and stops): wall time per epoch
and where the time goes (waiting for data, computing, evaluating and checkpointing).
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from vit_train.config import Config

from .folders import write_cifar_folder, write_jpeg_folder
from .record import Recorder, read_metrics, read_results, run_command, start_group, stop_group, vit_train

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/: benchmark.py
import benchmark  # noqa: E402

SIZES = {
    "gpu": dict(cifar=(50_000, 10_000), workers=16, batch=1024, steps=100, log_every=10, jpegs=5000,
                jpeg_size=(500, 375), jpeg_batch=256, model=["model=vit_tiny"], e2e_batch=None, e2e_epochs=None),
    "smoke": dict(cifar=(512, 128), workers=2, batch=64, steps=12, log_every=4, jpegs=40, jpeg_size=(50, 38),
                  jpeg_batch=8, model=["model=vit_micro", "model.depth=2"], e2e_batch=32, e2e_epochs=2),
}
E2E_STOP_MARGIN = 25  # seconds before the part's deadline at which the end-to-end run is stopped


def sizes(rec: Recorder) -> dict:
    return SIZES["smoke" if rec.smoke else "gpu"]


def cifar_root(rec: Recorder) -> Path:
    """The CIFAR-format folder both parts use, written once (its time recorded by the part that wrote it)."""
    root, seconds = write_cifar_folder(rec.work.parent / "cifar", *sizes(rec)["cifar"])
    if seconds:
        rec.figure("cifar_folder_seconds", seconds, "s", "writing the CIFAR-format folder (generated images)")
    return root


def run_data(rec: Recorder) -> None:
    s, device = sizes(rec), torch.device(rec.device)
    count = s["cifar"][0]
    for kind, label in (("device", "on-device pipeline"), ("loader", f"DataLoader, {s['workers']} workers")):
        rate = benchmark.pipeline_images_per_second(kind, count, 32, s["batch"], device, s["workers"])
        rec.figure(f"cifar_{kind}_images_per_s", rate, "img/s", f"CIFAR-shaped uint8, aug=basic: {label}")
    root = cifar_root(rec)
    for kind in ("device", "loader"):
        vit_tiny_run(rec, root, kind)
    jpegs, seconds = write_jpeg_folder(rec.work / "jpegs", s["jpegs"], s["jpeg_size"], s["workers"])
    rec.figure("jpeg_folder_seconds", seconds, "s", f"writing {s['jpegs']} JPEGs of {s['jpeg_size'][0]}x"
               f"{s['jpeg_size'][1]}")
    rate = image_folder_rate(jpegs, s, device)
    rec.figure("jpeg_loader_images_per_s", rate, "img/s", f"image folder of {s['jpeg_size'][0]}x{s['jpeg_size'][1]} "
               f"JPEGs at 224, aug=basic: DataLoader, {s['workers']} workers")


def vit_tiny_run(rec: Recorder, root: Path, kind: str) -> None:
    """A short vit-train run (aug=basic) reading through `kind` (device or loader): images/s and data wait."""
    s = sizes(rec)
    run_dir = rec.work / f"vit_tiny_{kind}"
    workers = [f"data.num_workers={s['workers']}"] if kind == "loader" else []
    done = run_command(vit_train("data=cifar10", f"data.root={root}", "data.download=false", *s["model"], "aug=basic",
                                 f"data.batch_size={s['batch']}", f"trainer.max_steps={s['steps']}",
                                 f"trainer.log_every={s['log_every']}", f"data.pipeline={kind}", *workers,
                                 f"trainer.device={rec.device}", "trainer.progress=false", f"hydra.run.dir={run_dir}"),
                       rec.work, rec.left(), rec.work / "commands.log")
    windows = read_metrics(run_dir, "train")[1:]  # the first window holds the warm-up
    label = f"ViT-Ti/4 run, batch {s['batch']}, {'on-device pipeline' if kind == 'device' else 'DataLoader'}"
    if not rec.check(f"{kind}_run", done.returncode == 0 and bool(windows), f"{label}: completes", done.tail()
                     if done.returncode else f"{read_results(run_dir).get('steps')} steps"):
        return
    rec.figure(f"{kind}_run.images_per_s", statistics.median(w["images_per_s"] for w in windows), "img/s",
               f"{label}: training images/s")
    rec.figure(f"{kind}_run.data_wait", statistics.mean(w["data_wait"] for w in windows), "share",
               f"{label}: share of step time waiting for data")


def image_folder_rate(root: Path, s: dict, device: torch.device) -> float:
    """Images/s of vit-train's image-folder loader over two epochs, after the first batch (worker start-up)."""
    cfg = Config.from_dict({"data": {"name": "imagefolder", "root": str(root), "batch_size": s["jpeg_batch"],
                                     "num_workers": s["workers"]}, "model": {"img_size": 224, "patch_size": 16},
                            "trainer": {"device": device.type}})
    data = cfg.data.build(cfg, device)
    seen, start = 0, None
    for epoch in range(2):
        data.train_sampler.set_epoch(epoch)
        for images, *_ in data.train_loader:
            images = images.to(device, non_blocking=True)
            if start is None:
                start = time.perf_counter()
                continue
            seen += len(images)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return seen / (time.perf_counter() - start)


def run_e2e(rec: Recorder) -> None:
    s = sizes(rec)
    root = cifar_root(rec)
    run_dir = rec.work / "e2e"
    extra = [f"data.batch_size={s['e2e_batch']}", f"trainer.epochs={s['e2e_epochs']}", "model.embed_dim=32",
             "model.depth=2", "model.num_heads=2"] if rec.smoke else []
    argv = vit_train("experiment=cifar10_vit_tiny", f"data.root={root}", "data.download=false",
                     f"data.num_workers={s['workers']}", f"trainer.device={rec.device}", "trainer.progress=false",
                     *extra, f"hydra.run.dir={run_dir}")
    start, epoch_ends, proc = follow(rec, argv, run_dir)
    results = read_results(run_dir)
    code = proc.returncode
    rec.check("e2e_run", code in (0, 143) and bool(epoch_ends), "cifar10_vit_tiny recipe runs (stopped by "
              "SIGTERM at the time limit)", f"exit {code}, status {results.get('status')}, {len(epoch_ends)} epochs, "
              f"{results.get('steps')} steps")
    rec.figure("epochs", len(epoch_ends), "epochs", "end-to-end: epochs completed in the time box")
    rec.figure("final_top1", results.get("final_top1"), "%", "end-to-end: val top-1 at the last epoch (generated data)")
    if not epoch_ends:
        return
    walls = [b - a for a, b in zip([start] + epoch_ends, epoch_ends)]
    rec.figure("first_epoch_seconds", walls[0], "s", "end-to-end: first epoch, start-up included")
    rec.figure("epoch_seconds", statistics.median(walls[1:] or walls), "s",
               "end-to-end: wall time per epoch (median; training, eval and checkpoint)")
    windows = read_metrics(run_dir, "train")[1:] or read_metrics(run_dir, "train")
    if windows:
        split(rec, walls[1:] or walls, windows, s)


def follow(rec: Recorder, argv: list[str], run_dir: Path) -> tuple[float, list[float], object]:
    """Start vit-train, note when each epoch's eval is logged, SIGTERM it at the time limit."""
    start = time.time()
    log = open(rec.work / "e2e.log", "w")
    proc = start_group(argv, rec.work, stdout=log, stderr=subprocess.STDOUT)
    epoch_ends: list[float] = []
    while proc.poll() is None:
        time.sleep(0.25)
        evals = len(read_metrics(run_dir, "val"))
        epoch_ends += [time.time()] * (evals - len(epoch_ends))
        if rec.left() < E2E_STOP_MARGIN:
            stop_group(proc, grace=E2E_STOP_MARGIN - 5)
    log.close()
    evals = len(read_metrics(run_dir, "val"))
    epoch_ends += [time.time()] * (evals - len(epoch_ends))
    return start, epoch_ends, proc


def split(rec: Recorder, walls: list[float], windows: list[dict], s: dict) -> None:
    """Where an epoch's wall time goes: training (waiting for data + computing) and the rest (eval, checkpoint)."""
    rate = statistics.median(w["images_per_s"] for w in windows)
    wait = statistics.mean(w["data_wait"] for w in windows)
    batch = s["e2e_batch"] or 128  # the recipe's batch
    images = s["cifar"][0] // batch * batch
    train = images / rate
    epoch = statistics.median(walls)
    rec.figure("images_per_s", rate, "img/s", "end-to-end: training images/s (median of the logged windows)")
    rec.figure("data_wait", wait, "share", "end-to-end: share of training time waiting for data")
    rec.figure("data_seconds", train * wait, "s", "end-to-end: per epoch, waiting for data")
    rec.figure("compute_seconds", train * (1 - wait), "s", "end-to-end: per epoch, computing (forward, backward, step)")
    rec.figure("other_seconds", max(epoch - train, 0.0), "s", "end-to-end: per epoch, eval, checkpoint and the rest")
