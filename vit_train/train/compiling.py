"""What trainer.compile compiles in a run, and the parts of compiling that are not the step itself.

`compile_scope` decides (`model`: the model's forward and backward; `step`: the whole training step as one graph,
compiled_step.py; a run where the step cannot be one graph says why in one line and compiles the model);
`compile_options` turns `trainer.compile_mode` into Inductor's options, random ops drawn by the eager kernels
(`fallback_random`: the eager step's masks, and not Inductor's random path, which duplicates dropout masks on CUDA
since torch 2.13: pytorch #198333); `evaluators` and `StaticBatch` evaluate the compiled model at one batch shape;
`cuda_graph_skips` names the CUDA graphs Inductor decides not to replay; `forget_compiled` keeps repeated runs in
one process under dynamo's limit of compiled entries per function.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from vit_train.errors import ConfigError

log = logging.getLogger("vit_train")


def compile_options(mode: str, device: torch.device) -> dict[str, Any]:
    """Inductor options for `trainer.compile_mode` (torch.compile takes a mode or options, not both), with the
    eager kernels for random ops (`fallback_random`: pytorch #198333, and the eager step's masks)."""
    options = dict(torch._inductor.list_mode_options(mode))
    if device.type != "cuda":  # CUDA graphs need a CUDA device: say nothing of them elsewhere (`cuda_graphs_note`)
        options.pop("triton.cudagraphs", None)
    return {**options, "fallback_random": True}


def cuda_graphs_note(mode: str, device: torch.device) -> str | None:
    """The line saying that a CUDA-graph mode has no CUDA graphs on this device; None where it has."""
    if "triton.cudagraphs" in torch._inductor.list_mode_options(mode) and device.type != "cuda":
        return (
            f"trainer.compile_mode={mode} replays CUDA graphs, which need a CUDA device: on {device.type} it "
            f"compiles without them"
        )
    return None


def traces_backward() -> bool:
    """Whether this torch's dynamo can trace the backward pass into a graph (`trace_autograd_ops`: torch >= 2.11)."""
    return hasattr(torch._dynamo.config, "trace_autograd_ops")


def fallback_reason(world_size: int, fp16: bool, sharded: bool) -> str | None:
    """Why the whole step cannot be one graph in this run (None: it can), said before anything is built."""
    if not traces_backward():
        return f"torch {torch.__version__} cannot trace the backward pass into the step's graph (torch >= 2.11 can)"
    if world_size > 1:
        return f"with {world_size} processes the gradients are all-reduced by DDP/FSDP outside any graph"
    if fp16:
        return "fp16's GradScaler reads the host every step (trainer.precision=bf16 or fp32 compile it whole)"
    if sharded:
        return "an FSDP-sharded model"
    return None


class StaticBatch(nn.Module):
    """A compiled module evaluated at one batch shape: a smaller batch (the val set's last) is padded with zeros
    to `batch` rows, and the outputs are cut back to its rows and copied (a CUDA graph's next replay overwrites
    its outputs: pytorch #148439). Every tensor argument with the batch's rows is padded alike (MAE's noise).
    Rows do not meet in a ViT or a ResNet in eval mode, so the real rows' outputs are the unpadded ones; one
    shape means one graph, and with CUDA graphs one memory pool (pytorch #188150, #128424).

    `seconds`: its first call's, which compiles (the model's evaluation graph), for the run's compile time."""

    def __init__(self, compiled: nn.Module, batch: int):
        super().__init__()
        self.compiled, self.batch, self.seconds = compiled, batch, None

    def forward(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        rows = len(x)
        if rows < self.batch:
            x, args, kwargs = (padded(v, rows, self.batch) for v in (x, args, kwargs))
        started = time.perf_counter() if self.seconds is None else None
        if started is None:
            out = self.compiled(x, *args, **kwargs)
        else:
            try:
                out = self.compiled(x, *args, **kwargs)
            except Exception as e:  # noqa: BLE001 - a compiler failure: this and later passes run the plain module
                log.warning("the evaluation could not be compiled (%s); it runs eagerly", compiler_error(e))
                self.compiled = getattr(self.compiled, "_orig_mod", self.compiled)
                out = self.compiled(x, *args, **kwargs)
        out = torch.utils._pytree.tree_map(lambda t: t[:rows].clone() if isinstance(t, torch.Tensor) else t, out)
        if started is not None:
            if x.is_cuda:
                torch.cuda.synchronize(x.device)
            self.seconds = time.perf_counter() - started
        return out


def padded(value: Any, rows: int, batch: int) -> Any:
    """`value` (a tensor, or a tuple/dict of them) with every tensor of `rows` rows padded with zeros to `batch`."""

    def pad(t: Any) -> Any:
        if not isinstance(t, torch.Tensor) or not t.ndim or len(t) != rows:
            return t
        return torch.cat([t, t.new_zeros((batch - rows, *t.shape[1:]))])

    return torch.utils._pytree.tree_map(pad, value)


def compile_scope(t: Any, device: torch.device, world_size: int, fp16: bool, sharded: bool, speaks: bool) -> str | None:
    """What trainer.compile compiles in this run: None (nothing, or an FSDP model, whose blocks train/sharding.py
    compiled), "model", or "step"; a step that cannot be one graph here (`fallback_reason`) is said in one warning
    (when `speaks`) and the model is compiled instead; so is a CUDA-graph mode off CUDA (`cuda_graphs_note`)."""
    if not t.compile:
        return None
    backends = torch._dynamo.list_backends(exclude_tags=())
    if t.compile_backend not in backends:
        raise ConfigError(
            f"trainer.compile_backend={t.compile_backend} is not a torch.compile backend here; choose "
            f"one of {', '.join(b for b in backends if 'TESTING' not in b)}"
        )
    if t.compile_backend not in TORCH_BACKENDS:  # listed is not runnable (tvm without apache-tvm): tried on an addition
        try:
            torch.compile(lambda x: x + 1, backend=t.compile_backend)(torch.zeros(1))
        except Exception as e:  # noqa: BLE001 - whatever the backend raises: one line, before any work
            raise ConfigError(
                f"trainer.compile_backend={t.compile_backend} cannot compile here ({compiler_error(e)}); "
                f"install what it needs or give another backend (inductor, aot_eager)"
            ) from None
    if device.type != "cuda":  # Inductor's C++ build on a CPU machine: torch's line about CUDA_HOME means nothing here
        logging.getLogger("torch.utils.cpp_extension").addFilter(no_cuda_home_line)
    note = cuda_graphs_note(t.compile_mode, device)
    if note and speaks:
        log.warning("%s", note)
    if sharded:
        return None
    if t.compile_scope == "step":
        reason = fallback_reason(world_size, fp16, sharded)
        if reason:
            if speaks:
                log.warning(
                    "trainer.compile_scope=step: %s; the model is compiled instead (trainer.compile_scope=model)",
                    reason,
                )
            return "model"
    return t.compile_scope


# torch.compile backends that need nothing beyond torch; others (tvm, openxla, ...) are tried before a run uses them
TORCH_BACKENDS = ("inductor", "aot_eager", "eager", "aot_eager_decomp_partition", "aot_eager_default_partitioner")


def compiler_error(error: BaseException) -> str:
    """A compiler's failure in one line: its type and words, without dynamo's wrapping (`backend='x' raised:`) and its
    advice on verbose logs."""
    text = " ".join(str(error).split()).split(" Set TORCHDYNAMO_VERBOSE")[0]
    inner = re.match(r"backend='[^']*' raised: (.*)", text)
    return (inner.group(1) if inner else f"{type(error).__name__}: {text}" if text else type(error).__name__)[:300]


def no_cuda_home_line(record: logging.LogRecord) -> bool:
    """False for torch's warning, on a machine without CUDA, that it takes CUDA_HOME to build C++ (Inductor's CPU
    kernels need no CUDA): a logging filter (adding it again changes nothing)."""
    return "No CUDA runtime is found" not in record.getMessage()


def evaluators(
    scope: str | None,
    t: Any,
    model: nn.Module,
    step_fn: nn.Module,
    ema: Any,
    eval_batch: int,
    device: torch.device,
    several: bool,
) -> tuple[nn.Module, nn.Module | None]:
    """(what evaluates the model, what evaluates the EMA's weights): the compiled model at one batch shape
    (`StaticBatch`) when the model is compiled and one process evaluates; else the plain modules."""
    plain_ema = ema.module if ema is not None else None
    if scope is None or several:
        return (model if several else step_fn), plain_ema
    if scope == "model":
        return StaticBatch(step_fn, eval_batch), plain_ema

    forget_compiled(type(model).forward)

    def compiled(module: nn.Module) -> StaticBatch:
        options = compile_options(t.compile_mode, device) if t.compile_backend == "inductor" else None
        return StaticBatch(torch.compile(module, dynamic=False, backend=t.compile_backend, options=options), eval_batch)

    return compiled(model), compiled(plain_ema) if plain_ema is not None else None


CUDA_GRAPH_LOG = "torch._inductor.cudagraph_utils.__cudagraphs"  # where Inductor says why it skips CUDA graphs


@contextmanager
def cuda_graph_skips() -> Iterator[list[str]]:
    """Inside, the reasons Inductor gives for not replaying what it compiles as CUDA graphs ("skipping cudagraphs
    due to mutated inputs", ...: a mode with CUDA graphs then runs the compiled code without them, silently). Its
    log is off unless TORCH_LOGS=cudagraphs; the skips are counted either way, and a skip whose words this torch
    logs elsewhere is named as such."""
    reasons: list[str] = []
    before = torch._dynamo.utils.counters["inductor"]["cudagraph_skips"]

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            reasons.append(record.getMessage().removeprefix("skipping cudagraphs due to ").strip())

    logger, handler = logging.getLogger(CUDA_GRAPH_LOG), Keep(logging.WARNING)
    logger.addHandler(handler)
    try:
        yield reasons
    finally:
        logger.removeHandler(handler)
        if torch._dynamo.utils.counters["inductor"]["cudagraph_skips"] > before and not reasons:
            reasons.append("Inductor skipped CUDA graphs; TORCH_LOGS=cudagraphs says why")


def forget_compiled(function: Callable) -> None:
    """Drop what dynamo compiled for `function` before (an earlier run in this process: a notebook, a test):
    the entries of runs whose tensors are gone never match again, yet count towards dynamo's limit of entries a
    function (`recompile_limit`, 8), past which a whole-graph compilation fails."""
    reset = getattr(torch._dynamo, "reset_code", None)
    if reset is not None:
        reset(function.__code__)
