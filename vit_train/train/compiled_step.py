"""trainer.compile_scope=step: the whole training step as one compiled graph.

`torch.compile(..., fullgraph=True)` of one function holding forward, loss, backward (dynamo traces
`torch.autograd.grad` with `trace_autograd_ops`, torch >= 2.11), gradient clipping, the non-finite skip,
the optimiser's update (torch's own functional AdamW / SGD, `capturable`, with the learning rate a device
tensor), the EMA (`_foreach_lerp_`), the skip counts and the train row's sums. With
`trainer.compile_mode=reduce-overhead` on CUDA the graph replays as one CUDA graph: no host read inside,
every tensor it updates in place marked static (`torch._dynamo.mark_static_address`), so nothing is copied
in or out but the batch.

Outside the graph, on the host, per step: the schedule's factor for this step written into a 0-dim device
tensor (`fill_`, no sync), random draws that come from generators of their own (an objective's
`Loss.draws`, MAE's masks), and the counters that are Python numbers (images trained, the scheduler).

The step is numerically the eager step (train/step.py): the same loss, the same clipping formula, torch's
AdamW/SGD arithmetic (its capturable form: the bias corrections are float32 device tensors instead of
Python floats, a few ulp apart), the same skip rule (a non-finite loss or gradient norm leaves weights,
moments, step counts and the EMA as they were), the same EMA. tests/train/test_compiled_step.py measures
the difference from the eager step over 50 steps. Random ops inside the graph (dropout, drop path) use
the eager kernels (`fallback_random`): the same masks as the eager step from the same RNG state, and not
Inductor's own random path, which duplicates dropout masks on CUDA since torch 2.13 (pytorch #198333).

Where it cannot run (torch without `trace_autograd_ops`, several processes, fp16's GradScaler, a loss
dynamo cannot trace whole, a failed compilation) one warning line says why and the eager step runs
(`fallback_reason` at build time, `CompiledStep.__call__` at the first call), with the model compiled as
`trainer.compile_scope=model` does where that still applies.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from vit_train.schema.sections import OptimConfig
from vit_train.train.compiling import compile_options, compiler_error, cuda_graph_skips, forget_compiled
from vit_train.train.skips import SkippedSteps
from vit_train.train.throughput import TrainWindow

log = logging.getLogger("vit_train")


class CompiledStep:
    """The training step as one compiled graph; called as the eager `train_step` is (train/step.py), it returns
    False when it did not take the step (its compilation failed: one warning, and from then on the eager
    step runs: `active` is False).

    `params` are the optimiser's (every parameter that trains, in its groups' order); `factor` is the
    schedule's multiplier of each group's peak lr for the step about to run, which `__call__` takes from
    `schedule(step)` (0-based) and writes into a device tensor.
    """

    def __init__(
        self,
        model: nn.Module,
        loss: Any,
        optimizer: torch.optim.Optimizer,
        optim: OptimConfig,
        ema: Any,
        window: TrainWindow,
        skips: SkippedSteps,
        accum_steps: int,
        amp_dtype: torch.dtype | None,
        device: torch.device,
        schedule: Callable[[int], float],
        ema_decay: float | None = None,
        mode: str = "default",
        backend: str = "inductor",
        seconds: dict[str, float] | None = None,
    ):
        self.model, self.loss, self.optimizer, self.ema = model, loss, optimizer, ema
        self.window, self.skips, self.accum_steps = window, skips, accum_steps
        self.optim, self.max_norm = optim, optim.clip_grad or math.inf
        self.amp_dtype, self.device, self.schedule = amp_dtype, device, schedule
        self.groups = [dict(g) for g in optimizer.param_groups]  # hyperparameters: constants of the graph
        self.params = [p for g in optimizer.param_groups for p in g["params"]]
        self.group_index = [
            list(
                range(
                    sum(len(g["params"]) for g in optimizer.param_groups[:i]),
                    sum(len(g["params"]) for g in optimizer.param_groups[: i + 1]),
                )
            )
            for i in range(len(optimizer.param_groups))
        ]  # each group's positions in `params`
        optim.init_state(optimizer)
        self.base_lr = torch.tensor(
            [g["initial_lr"] if "initial_lr" in g else g["lr"] for g in optimizer.param_groups],
            dtype=torch.float32,
            device=device,
        )
        self.factor = torch.ones((), dtype=torch.float32, device=device)
        self.ema_params: list[torch.Tensor] = []
        self.model_params: list[torch.Tensor] = []
        if ema is not None:  # AveragedModel(use_buffers=True): parameters and buffers, as update_parameters pairs them
            self.ema_params = [*ema.module.parameters(), *ema.module.buffers()]
            self.model_params = [*model.parameters(), *model.buffers()]
            self.ema_decay = float(ema_decay)
        for t in self.state_tensors():  # updated in place by every replay: CUDA graphs keep their addresses
            torch._dynamo.mark_static_address(t)
        torch._dynamo.config.trace_autograd_ops = True  # backward() as autograd.grad inside the graph
        forget_compiled(CompiledStep._step)
        self.compiled = torch.compile(
            self._step,
            fullgraph=True,
            backend=backend,
            options=compile_options(mode, device) if backend == "inductor" else None,
        )
        self.active, self.calls, self.mode = True, 0, mode
        self.shape: torch.Size | None = None  # the global batch's shape the graph was compiled for
        self.seconds = {} if seconds is None else seconds  # the run's compile times: "step" set by the first call

    def state_tensors(self) -> list[torch.Tensor]:
        """Every tensor the graph updates in place besides the model's parameters and buffers."""
        state = [t for p in self.params for t in self.optimizer.state[p].values() if isinstance(t, torch.Tensor)]
        ema = [*self.ema_params, self.ema.n_averaged] if self.ema is not None else []
        return [*state, *ema, self.base_lr, self.factor, *self.window.sums(), self.skips.skipped, self.skips.run]

    def __call__(self, images: torch.Tensor, targets: torch.Tensor, step: int) -> bool:
        """Take optimiser step `step` (counted from 1) on the global batch (`images` (B, 3, H, W), `targets` (B,)
        or (B, classes)); False when compiling failed (the eager step takes it, and every later one).

        The first call compiles: its seconds are `seconds["step"]`, kept out of the train window (images/s, MFU)
        with its images."""
        if not self.active or (self.shape is not None and images.shape != self.shape):
            return False  # another batch shape (a resumed epoch's short last batch): one eager step, not a new graph
        self.shape = images.shape
        self.factor.fill_(self.schedule(step - 1))
        chunks = list(zip(images.chunk(self.accum_steps), targets.chunk(self.accum_steps), strict=True))
        drawn = [self.loss.draws(x) for x, _ in chunks]  # an objective's own generators, outside the graph
        if self.calls:
            self.window.has_top1 |= self.compiled(chunks, drawn, len(images))
            self.window.images += len(images)
        else:
            with self.window.paused(), cuda_graph_skips() as skipped:
                started = time.perf_counter()
                try:
                    self.window.has_top1 |= self.compiled(chunks, drawn, len(images))
                except Exception as e:  # noqa: BLE001 - any compiler failure: the eager step runs instead
                    self.active = False
                    self.seconds["step"] = time.perf_counter() - started  # spent trying: said apart, as compile time
                    for group in self.optimizer.param_groups:  # capturable AdamW runs eagerly on CUDA devices only
                        group["capturable"] = group.get("capturable", False) and self.device.type == "cuda"
                    log.warning(
                        "trainer.compile_scope=step: the training step could not be compiled (%s); the eager step runs",
                        compiler_error(e),
                    )
                    return False
                if self.device.type == "cuda":
                    torch.cuda.synchronize(self.device)
                self.seconds["step"] = time.perf_counter() - started
            if skipped:  # Inductor compiled the step but will not replay it as a CUDA graph
                log.warning(
                    "trainer.compile_mode=%s: the step runs compiled, not as a CUDA graph (%s)",
                    self.mode,
                    "; ".join(skipped),
                )
            self.optimizer._opt_called = True  # what Optimizer.step's wrapper records: the scheduler's order check
        self.calls += 1
        return True

    @contextmanager
    def eager_optimizer(self) -> Iterator[None]:
        """Inside, the optimiser takes an eager step (a batch of another shape): its capturable form runs eagerly on
        CUDA only, so on the CPU it is its plain form for that step (the same arithmetic on CPU tensors)."""
        groups = self.optimizer.param_groups
        before = [g.get("capturable", False) for g in groups]
        for group in groups:
            group["capturable"] = group.get("capturable", False) and self.device.type == "cuda"
        try:
            yield
        finally:
            for group, capturable in zip(groups, before, strict=True):
                group["capturable"] = capturable

    def _step(self, chunks, drawn, batch: int) -> bool:
        """The graph: forward and backward over the micro-batches, clipping, the skip, the update, the EMA, the counts."""
        total = torch.zeros((), device=self.device)
        hits = torch.zeros((), device=self.device, dtype=torch.long)
        counted = False
        grads: list[torch.Tensor | None] | None = None
        for (x, y), extra in zip(chunks, drawn, strict=True):
            with torch.autocast(self.device.type, dtype=self.amp_dtype, enabled=self.amp_dtype is not None):
                loss, logits = self.loss(self.model, x, y, **extra)
                loss = loss / self.accum_steps if len(x) * self.accum_steps == batch else loss * (len(x) / batch)
            new = torch.autograd.grad(loss, self.params, allow_unused=True)
            grads = (
                list(new)
                if grads is None
                else [g if n is None else n if g is None else g + n for g, n in zip(grads, new, strict=True)]
            )
            total = total + loss.detach()
            if logits is not None:
                counted = True
                hits = hits + (logits.detach().argmax(1) == (y.argmax(1) if y.ndim == 2 else y)).sum()
        used = [g for g in grads if g is not None]  # eager: a parameter without a gradient is left alone
        norm = torch.nn.utils.get_total_norm(used)
        clip = torch.clamp(self.max_norm / (norm + 1e-6), max=1.0)  # nn.utils.clip_grad_norm_'s formula
        torch._foreach_mul_(used, clip)
        finite = torch.isfinite(total) & torch.isfinite(norm)
        with torch.no_grad():
            self._update(grads, finite)
            if self.ema is not None:
                self._average(finite)
            self.skips.add(finite)
            self.window.add_(total, norm, hits if counted else None, batch, finite)
        return counted

    def _update(self, grads: list[torch.Tensor | None], finite: torch.Tensor) -> None:
        """torch's functional AdamW or SGD per group, lr = peak x schedule factor (device tensors); a non-finite
        step leaves every parameter and state tensor as it was. `grads` line up with `params` (None: unused)."""
        touched = [
            t
            for p, g in zip(self.params, grads, strict=True)
            if g is not None
            for t in (p, *self.optimizer.state[p].values())
        ]
        before = [t.clone() for t in touched]
        for i, group in enumerate(self.groups):
            index = [j for j in self.group_index[i] if grads[j] is not None]
            if not index:
                continue
            params, lr = [self.params[j] for j in index], self.factor * self.base_lr[i]
            self.optim.update(params, [grads[j] for j in index], [self.optimizer.state[p] for p in params], group, lr)
        for t, old in zip(touched, before, strict=True):
            t.copy_(torch.where(finite, t, old))

    def _average(self, finite: torch.Tensor) -> None:
        """AveragedModel.update_parameters with get_ema_multi_avg_fn(decay), on the device: the first update copies
        the weights, later ones lerp by 1 - decay; a skipped step leaves the EMA (and its count) as it was."""
        first = self.ema.n_averaged == 0
        weight = torch.where(first, 1.0, 1.0 - self.ema_decay) * finite
        floats = [(e, p) for e, p in zip(self.ema_params, self.model_params, strict=True) if e.is_floating_point()]
        if floats:
            torch._foreach_lerp_([e for e, _ in floats], [p for _, p in floats], weight.to(floats[0][0].dtype))
        for e, p in zip(self.ema_params, self.model_params, strict=True):
            if not e.is_floating_point():  # integer buffers (BatchNorm's count), as get_ema_multi_avg_fn does them
                mixed = torch.where(first, p, (e * self.ema_decay + p * (1 - self.ema_decay)).to(e.dtype))
                e.copy_(torch.where(finite, mixed, e))
        self.ema.n_averaged.add_(finite.to(self.ema.n_averaged.dtype))
