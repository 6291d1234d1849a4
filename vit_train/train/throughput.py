"""Throughput: the training window's images/s, data-wait share, achieved TFLOP/s and MFU (model FLOP
utilisation = achieved FLOP/s / peak), from the training FLOPs per image (counted once, on the meta
device) and the peak FLOP/s of known GPUs."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from vit_train.models.flops import flops_per_image as flops_per_image  # re-export: scripts import it here
from vit_train.outputs.metrics import NullLogger, RunLogger

log = logging.getLogger("vit_train")

DATA_BOUND = 0.2  # warn when more than this share of the step time waits for data

# Dense peak TFLOP/s by datasheet, by GPU name fragment: (bf16/fp16 tensor cores, tf32).
PEAKS = {
    "H200": (989.0, 494.0),
    "H100": (989.0, 494.0),
    "GH200": (989.0, 494.0),
    "B200": (2250.0, 1100.0),
    "A100": (312.0, 156.0),
    "A10G": (70.0, 35.0),
    "L40S": (362.0, 183.0),
    "L4": (121.0, 60.0),
    "RTX 4090": (165.0, 82.6),
    "RTX 3090": (71.0, 35.6),
    "V100": (125.0, 15.7),
    "T4": (65.0, 8.1),
}


def peak_tflops(
    device: torch.device, dtype: torch.dtype | None, override: float | None, name: str | None = None
) -> float | None:
    """`trainer.peak_tflops` if set, else the datasheet figure for this GPU and precision; None when unknown."""
    if override:
        return override
    if device.type != "cuda":
        return None
    name = name or torch.cuda.get_device_name(device)
    for fragment, (half, tf32) in PEAKS.items():
        if fragment in name:
            return half if dtype in (torch.bfloat16, torch.float16) else tf32
    return None


class TrainWindow:
    """Train metrics between two logs, summed on the device and read once per log (one host sync).

    The clock runs only between start() and pause(), so evaluation and checkpoint writes do not
    count as training time. `wait` adds time spent waiting for the next batch (data-wait); with
    `flops_per_image` (and `peak_tflops`) the window reports achieved TFLOP/s (and MFU).
    """

    def __init__(self, device: torch.device, flops_per_image: float | None = None, peak_tflops: float | None = None):
        self.flops_per_image, self.peak_tflops = flops_per_image, peak_tflops
        self.waited = 0.0
        self.logs, self.warned = 0, False  # reads so far; whether the data-bound warning was given
        self.loss = torch.zeros((), device=device)
        self.hits = torch.zeros((), device=device, dtype=torch.long)
        self.finite_steps = torch.zeros((), device=device, dtype=torch.long)  # steps, images not skipped
        self.finite_images = torch.zeros((), device=device, dtype=torch.long)
        self.has_top1 = False
        self.grad_norm = torch.full((), math.nan, device=device)  # the last finite step's (else the window's first)
        self.has_grad_norm = torch.zeros((), dtype=torch.bool, device=device)  # whether a step came since the read
        self.images = 0
        self.seconds = 0.0
        self._started: float | None = None
        self.advice = "raise data.num_workers"  # what the data-bound warning says to do (the data set's advice)

    def start(self) -> None:
        self._started = time.perf_counter()

    def pause(self) -> None:
        if self._started is not None:
            self.seconds += time.perf_counter() - self._started
            self._started = None

    def wait(self, seconds: float) -> None:
        self.waited += seconds

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Time spent inside (evaluation, checkpoint writes) does not count as training time."""
        running = self._started is not None
        self.pause()
        try:
            yield
        finally:
            if running:
                self.start()

    def add(
        self, loss: torch.Tensor, grad_norm: torch.Tensor, hits: torch.Tensor | None, images: int, finite: torch.Tensor
    ) -> None:
        """One step's mean loss, gradient norm and top-1 hits (None: the objective has no class
        predictions), counted without a host sync; a skipped (non-finite) step's values are left out,
        since its loss would make the window's mean NaN."""
        self.images += images
        if hits is not None:
            self.has_top1 = True
        self.add_(loss, grad_norm, hits, images, finite)

    def add_(
        self, loss: torch.Tensor, grad_norm: torch.Tensor, hits: torch.Tensor | None, images: int, finite: torch.Tensor
    ) -> None:
        """`add`'s device sums alone, each updated in place (inside a compiled step: train/compiled_step.py, which
        counts the images and `has_top1` on the host)."""
        self.loss.add_(torch.where(finite, loss, 0.0))
        if hits is not None:
            self.hits.add_(torch.where(finite, hits, 0))
        # the window's first step's norm, then each finite step's: a window of skipped steps logs the first's
        self.grad_norm.copy_(torch.where(finite | ~self.has_grad_norm, grad_norm, self.grad_norm))
        self.has_grad_norm.fill_(True)
        self.finite_steps.add_(finite.long())
        self.finite_images.add_(finite.long() * images)

    def sums(self) -> list[torch.Tensor]:
        """The device tensors `add_` updates in place."""
        return [self.loss, self.hits, self.finite_steps, self.finite_images, self.grad_norm, self.has_grad_norm]

    def read(self) -> tuple[dict[str, float], int, float]:
        """(mean loss, top-1 %, last gradient norm and images/s; images; seconds) since the last read.

        Starts a new window.
        """
        self.pause()
        steps, counted = int(self.finite_steps.item()), int(self.finite_images.item())
        values = {
            "loss": self.loss.item() / steps if steps else math.nan,
            "top1": 100 * self.hits.item() / counted if counted else math.nan,
            "grad_norm": float(self.grad_norm) if self.has_grad_norm else math.nan,
            # none: the window's only steps compiled (their time is compile time, not training)
            "images_per_s": self.images / max(self.seconds, 1e-9) if self.images else math.nan,
            "data_wait": self.waited / max(self.seconds, 1e-9),
        }  # share of the step time spent waiting for data
        if not self.has_top1:
            del values["top1"]
        if self.flops_per_image:
            values["tflops"] = values["images_per_s"] * self.flops_per_image / 1e12
            if self.peak_tflops:
                values["mfu"] = values["tflops"] / self.peak_tflops
        read = (values, self.images, self.seconds)
        self.loss.zero_()
        self.hits.zero_()
        self.finite_steps.zero_()
        self.finite_images.zero_()
        self.grad_norm.fill_(math.nan)
        self.has_grad_norm.fill_(False)
        self.images = 0
        self.seconds = self.waited = 0.0
        self.start()
        return read

    def state_dict(self) -> dict[str, Any]:
        """The window's running sums as plain data, for the checkpoint ("train_window"): a run resumed from it
        logs at its next log the same row (loss, top-1, gradient norm) as the uninterrupted run, not a mean
        over the steps since the checkpoint. Under "timing", what depends on the clock (seconds trained and
        waited in the window, whether the data-bound warning was given): images/s stays a rate over the
        window's training time, the interrupted attempt's included."""
        grad_norm = self.grad_norm if self.has_grad_norm else None
        return {
            "loss": self.loss.item(),
            "hits": int(self.hits.item()),
            "finite_steps": int(self.finite_steps.item()),
            "finite_images": int(self.finite_images.item()),
            "has_top1": self.has_top1,
            "grad_norm": None if grad_norm is None else grad_norm.item(),
            "grad_norm_dtype": None if grad_norm is None else str(grad_norm.dtype).removeprefix("torch."),
            "images": self.images,
            "logs": self.logs,
            "timing": {"seconds": self.seconds, "waited": self.waited, "warned": self.warned},
        }

    def load_state_dict(self, saved: dict[str, Any] | None) -> None:
        """Continue the window a checkpoint's `state_dict` kept (None: a checkpoint written before windows were
        kept; the window starts empty). The sums go back in their own dtypes, so the row is bit-identical."""
        if not saved:
            return
        self.loss.fill_(saved["loss"])
        self.hits.fill_(saved["hits"])
        self.finite_steps.fill_(saved["finite_steps"])
        self.finite_images.fill_(saved["finite_images"])
        self.has_top1 = bool(saved["has_top1"])
        if saved["grad_norm"] is not None:  # float32, as summed (older checkpoints name the dtype: always float32)
            self.grad_norm.fill_(saved["grad_norm"])
            self.has_grad_norm.fill_(True)
        self.images, self.logs = int(saved["images"]), int(saved["logs"])
        timing = saved.get("timing", {})
        self.seconds, self.waited = float(timing.get("seconds", 0.0)), float(timing.get("waited", 0.0))
        self.warned = bool(timing.get("warned", False))


def log_train(
    logger: RunLogger | NullLogger,
    bar,
    window: TrainWindow,
    state,
    lr: float,
    scaler: torch.amp.GradScaler,
    terms: dict[str, float] | None = None,
) -> None:
    """The window's train metrics to the logs and the progress bar, with the objective's own `terms`
    (distill: its two loss terms and the teacher agreement); adds its images and seconds to `state` (a
    TrainState) for the run's images/s; warns once when the run waits on its data."""
    values, images, seconds = window.read()
    values.update(terms or {})
    values.update(lr=lr, skipped_steps=state.skipped_steps)
    if scaler.is_enabled():
        values["loss_scale"] = scaler.get_scale()
    state.add_trained(images, seconds)
    logger.scalars("train", state.step, values)
    extra = {"mfu": f"{100 * values['mfu']:.1f}%"} if "mfu" in values else {}
    bar.set_postfix(
        loss=f"{values['loss']:.4f}",
        lr=f"{lr:.2e}",
        img_s=f"{values['images_per_s']:.0f}",
        wait=f"{100 * values['data_wait']:.0f}%",
        **extra,
    )
    window.logs += 1
    if values["data_wait"] > DATA_BOUND and window.logs > 1 and not window.warned:  # the first window warms up
        window.warned = True
        log.warning(
            "the run is data-bound: %.0f%% of the step time waits for data; %s",
            100 * values["data_wait"],
            window.advice,
        )
