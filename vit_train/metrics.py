"""Where a run's numbers go: TensorBoard, metrics.jsonl, results.json and train.log."""

from __future__ import annotations

import json
import logging
import math
import os
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import torch
import yaml
from torch.utils.tensorboard import SummaryWriter

log = logging.getLogger("vit_train")

DATA_BOUND = 0.2  # warn when more than this share of the step time waits for data


class RunLogger:
    """Writes one run's metrics; on resume at step S, drops what an earlier attempt logged after S."""

    def __init__(self, run_dir: Path, resume_step: int | None = None):
        self.run_dir = run_dir
        self.jsonl = run_dir / "metrics.jsonl"
        if resume_step is not None:
            self._truncate_jsonl(resume_step)
        # purge_step hides events an interrupted attempt wrote after the checkpoint: no duplicate steps.
        self.tb = SummaryWriter(str(run_dir / "tb"), purge_step=None if resume_step is None else resume_step + 1)
        self.file_handler = logging.FileHandler(run_dir / "train.log")
        self.file_handler.setFormatter(logging.Formatter("[%(asctime)s][%(levelname)s] %(message)s"))
        log.addHandler(self.file_handler)
        if log.level == logging.NOTSET:
            log.setLevel(logging.INFO)

    def _truncate_jsonl(self, step: int) -> None:
        if not self.jsonl.exists():
            return
        lines = self.jsonl.read_text().splitlines()
        kept = [line for line in lines if line.strip() and json.loads(line)["step"] <= step]
        write_atomic(self.jsonl, "".join(line + "\n" for line in kept))

    def scalars(self, split: str, step: int, values: dict[str, float]) -> None:
        for name, value in values.items():
            self.tb.add_scalar(f"{split}/{name}", value, step)
        plain = {k: v if math.isfinite(v) else None for k, v in values.items()}  # NaN is not JSON
        with open(self.jsonl, "a") as f:
            f.write(json.dumps({"split": split, "step": step, **plain}) + "\n")

    def config(self, config: dict[str, Any], step: int) -> None:
        text = yaml.safe_dump(config, sort_keys=False)
        self.tb.add_text("config", "    " + text.replace("\n", "\n    "), step)  # indented: shown as code
        log.info("config:\n%s", text.rstrip())

    def close(self) -> None:
        self.tb.close()
        log.removeHandler(self.file_handler)
        self.file_handler.close()


class NullLogger:
    """What processes other than rank 0 log with: nothing (rank 0 writes the run's files)."""

    tb = None

    def scalars(self, split: str, step: int, values: dict[str, float]) -> None:
        pass

    def config(self, config: dict[str, Any], step: int) -> None:
        pass

    def close(self) -> None:
        pass


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
        self.grad_norm: torch.Tensor | None = None
        self.images = 0
        self.seconds = 0.0
        self._started: float | None = None

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

    def add(self, loss: torch.Tensor, grad_norm: torch.Tensor, hits: torch.Tensor | None, images: int,
            finite: torch.Tensor) -> None:
        """One step's mean loss, gradient norm and top-1 hits (None: the objective has no class
        predictions), counted without a host sync; a skipped (non-finite) step's values are left out,
        since its loss would make the window's mean NaN."""
        self.images += images
        self.loss += torch.where(finite, loss, 0.0)
        if hits is not None:
            self.has_top1 = True
            self.hits += torch.where(finite, hits, 0)
        self.grad_norm = grad_norm if self.grad_norm is None else torch.where(finite, grad_norm, self.grad_norm)
        self.finite_steps += finite.long()
        self.finite_images += finite.long() * images

    def read(self) -> tuple[dict[str, float], int, float]:
        """(mean loss, top-1 %, last gradient norm and images/s; images; seconds) since the last read.

        Starts a new window.
        """
        self.pause()
        steps, counted = int(self.finite_steps.item()), int(self.finite_images.item())
        values = {"loss": self.loss.item() / steps if steps else math.nan,
                  "top1": 100 * self.hits.item() / counted if counted else math.nan,
                  "grad_norm": float(self.grad_norm) if self.grad_norm is not None else math.nan,
                  "images_per_s": self.images / max(self.seconds, 1e-9),
                  "data_wait": self.waited / max(self.seconds, 1e-9)}  # share of the step time spent waiting for data
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
        self.grad_norm = None
        self.images = 0
        self.seconds = self.waited = 0.0
        self.start()
        return read


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def write_results(run_dir: Path, results: dict[str, Any]) -> None:
    write_atomic(run_dir / "results.json", json.dumps(results, indent=2) + "\n")


def log_train(logger: RunLogger | NullLogger, bar, window: TrainWindow, state, lr: float,
              scaler: torch.amp.GradScaler) -> None:
    """The window's train metrics to the logs and the progress bar; adds its images and seconds to
    `state` (a TrainState) for the run's images/s; warns once when the run waits on its data."""
    values, images, seconds = window.read()
    values.update(lr=lr, skipped_steps=state.skipped_steps)
    if scaler.is_enabled():
        values["loss_scale"] = scaler.get_scale()
    state.images_seen += images
    state.train_seconds += seconds
    logger.scalars("train", state.step, values)
    extra = {"mfu": f"{100 * values['mfu']:.1f}%"} if "mfu" in values else {}
    bar.set_postfix(loss=f"{values['loss']:.4f}", lr=f"{lr:.2e}", img_s=f"{values['images_per_s']:.0f}",
                    wait=f"{100 * values['data_wait']:.0f}%", **extra)
    window.logs += 1
    if values["data_wait"] > DATA_BOUND and window.logs > 1 and not window.warned:  # the first window warms up
        window.warned = True
        log.warning("the run is data-bound: %.0f%% of the step time waits for data. Raise data.num_workers, or on "
                    "a GPU use data.pipeline=device (shapes/CIFAR)", 100 * values["data_wait"])
