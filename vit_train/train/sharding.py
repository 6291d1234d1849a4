"""trainer.strategy=fsdp: the model's weights, gradients and optimiser state sharded over the processes
with PyTorch's FSDP2 (`torch.distributed.fsdp.fully_shard`), as torchtitan and OpenCLIP do.

Each unit the model family names (`shard_units`: a ViT's transformer blocks, the MAE decoder's) is one FSDP unit, then the root takes
what is left (patch embedding, tokens, positions, final norm, heads); a ResNet is one unit. The order
is OpenCLIP's: compile (per block) -> activation checkpointing (inside the block, models/vit.py) ->
shard. Every parameter becomes a DTensor holding this process's dim-0 shard; the optimiser is built
on those, so its moments are sharded too. A block's weights are all-gathered just before its forward
(and again before its backward when resharded after forward), its gradients reduce-scattered after.

- Mixed precision: trainer.precision=bf16 gathers and computes in bf16, reduces gradients in fp32 and
  keeps fp32 shards (MixedPrecisionPolicy); fp32 (and the CPU) has no policy. fp16 is refused: its
  GradScaler does not see sharded gradients (torchtitan refuses it too).
- The EMA (trainer.ema_decay) is sharded like the model: each process averages its own shards, with no
  communication; checkpoints hold it gathered.
- Checkpoints do not depend on the strategy: the full state dict (model, optimiser in torch's own
  layout keyed like the unsharded model's, EMA) is gathered to rank 0 on the CPU
  (torch.distributed.checkpoint.state_dict, full_state_dict + cpu_offload) and written in the usual
  format; resuming loads the weights into the whole model before sharding and the optimiser state with
  set_optimizer_state_dict (checkpoint/optimizer.py). So an FSDP run resumes under DDP or one process and
  the other way round.
- Evaluation (and rank 0's figures) runs with every unit gathered and kept gathered (`gathered`): the
  processes evaluate different numbers of val batches, which per-batch all-gathers could not follow.
- With one process (no torchrun) trainer.strategy=fsdp shards nothing: the run is the plain model's.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_optimizer_state_dict
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard, register_fsdp_forward_method
from torch.distributed.tensor import DTensor
from torch.optim.swa_utils import AveragedModel

from vit_train.checkpoint import param_names
from vit_train.config import Config
from vit_train.errors import ConfigError
from vit_train.runtime.distributed import Context

log = logging.getLogger("vit_train")

FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)  # whole tensors, on rank 0 only, on the CPU
# Methods other than forward that the run calls on a sharded unit: FSDP gathers the unit's weights for them
# and casts their inputs to the mixed-precision policy's dtype, as for forward (without it a bf16 run's
# attention figures met bf16 weights with fp32 images). The class-token model's last block, the figures.
BLOCK_METHODS = ("forward_first_tokens", "forward_with_weights")
ROOT_METHODS = ("attention_maps",)


def wanted(cfg: Config, ctx: Context) -> bool:
    """Whether this run shards: trainer.strategy=fsdp with more than one process."""
    return cfg.trainer.strategy == "fsdp" and ctx.enabled


def is_sharded(model: nn.Module) -> bool:
    return isinstance(model, FSDPModule)


def reshard_policy(cfg: Config) -> tuple[bool, bool]:
    """(blocks, root): whether each frees its gathered weights after forward. trainer.fsdp_reshard_after_forward
    null = torchtitan's default: blocks yes (gathered again for backward), the root no (its backward comes
    right after the forward ends, so freeing it would only gather it again)."""
    choice = cfg.trainer.fsdp_reshard_after_forward
    return (True, False) if choice is None else (choice, choice)


def shard(model: nn.Module, ema: AveragedModel | None, cfg: Config, amp_dtype: torch.dtype | None) -> None:
    """FSDP2 on `model` (and the EMA's copy), in place: each unit of its family (`shard_units`), then the root.

    Call it with the process group joined, the model on its device and its weights final (a checkpoint's
    loaded), before the optimiser is built. With trainer.compile each block is compiled first (the root
    runs eagerly). Raises ConfigError for trainer.precision=fp16.
    """
    if amp_dtype == torch.float16:
        raise ConfigError(
            "trainer.strategy=fsdp does not take fp16 (its GradScaler cannot see sharded gradients); "
            "use trainer.precision=bf16 or fp32"
        )
    policy = (
        MixedPrecisionPolicy(param_dtype=amp_dtype, reduce_dtype=torch.float32) if amp_dtype else MixedPrecisionPolicy()
    )
    blocks_reshard, root_reshard = reshard_policy(cfg)
    for module in (model, ema.module if ema is not None else None):
        if module is None:
            continue
        for block in cfg.model.shard_units(module):  # the model family's units: a ViT's blocks
            if cfg.trainer.compile and module is model:
                block.compile(mode=cfg.trainer.compile_mode)
            fully_shard(block, mp_policy=policy, reshard_after_forward=blocks_reshard)
            for method in [m for m in BLOCK_METHODS if hasattr(block, m)]:
                register_fsdp_forward_method(block, method)
        fully_shard(module, mp_policy=policy, reshard_after_forward=root_reshard)
        for method in ROOT_METHODS:
            if hasattr(module, method):
                register_fsdp_forward_method(module, method)
    if ema is not None and ema.multi_avg_fn is not None:
        ema.multi_avg_fn = _apart(ema.multi_avg_fn)


def _apart(multi_avg_fn):
    """The EMA's foreach update, once over the sharded parameters and once over the plain buffers (the
    fixed sin-cos positions): one foreach call cannot take DTensors and tensors together."""

    def update(averaged: list, current: list, num_averaged) -> None:
        for sharded in (True, False):
            pairs = [(a, c) for a, c in zip(averaged, current, strict=True) if isinstance(a, DTensor) == sharded]
            if pairs:
                multi_avg_fn([a for a, _ in pairs], [c for _, c in pairs], num_averaged)

    return update


def clip_grad_norm(parameters: Iterable[nn.Parameter], max_norm: float) -> torch.Tensor:
    """clip_grad_norm_ that also takes sharded (DTensor) gradients: the norm is over every shard of
    every process, the same scalar tensor on each (a plain tensor, not a DTensor)."""
    norm = nn.utils.clip_grad_norm_(parameters, max_norm)
    return norm.full_tensor() if isinstance(norm, DTensor) else norm


@contextmanager
def gathered(cfg: Config, *modules: nn.Module | None) -> Iterator[None]:
    """Every FSDP unit of `modules` all-gathered on entry (every process, in the same order) and kept
    gathered until exit, so forwards need no communication: the processes may run different numbers of
    them (evaluation shares, rank 0's figures). A no-op for modules that are not sharded."""
    per_module = [
        [m for m in module.modules() if isinstance(m, FSDPModule)] for module in modules if module is not None
    ]
    units = [unit for found in per_module for unit in found]
    roots = [found[0] for found in per_module if found]  # the outermost unit of each (an EMA's: its module)
    if not units:
        yield
        return
    for unit in units:
        unit.set_reshard_after_forward(False, recurse=False)
        unit.unshard()
    try:
        yield
    finally:
        blocks_reshard, root_reshard = reshard_policy(cfg)
        for unit in units:
            unit.reshard()
            root = any(unit is r for r in roots)
            unit.set_reshard_after_forward(root_reshard if root else blocks_reshard, recurse=False)


def full_states(
    model: nn.Module, optimizer: torch.optim.Optimizer, ema: AveragedModel | None
) -> tuple[dict, dict, dict | None] | None:
    """(model, optimiser, EMA) state dicts of a sharded run, gathered whole onto rank 0's CPU, in the
    layout an unsharded run saves (the optimiser keyed by parameter index as torch's own state_dict);
    empty dicts on the other ranks. A collective: every process calls it. None when not sharded."""
    if not is_sharded(model):
        return None
    weights = get_model_state_dict(model, options=FULL)
    moments = get_optimizer_state_dict(model, optimizer, options=FULL)
    averaged = get_model_state_dict(ema, options=FULL) if ema is not None else None
    if not weights:  # not rank 0
        return {}, {}, {} if ema is not None else None
    return weights, _by_index(model, optimizer, moments), averaged


def _by_index(model: nn.Module, optimizer: torch.optim.Optimizer, keyed: dict) -> dict:
    """get_optimizer_state_dict's name-keyed layout -> torch's index-keyed one (what an unsharded run saves)."""
    index = {name: i for i, name in enumerate(param_names(model, optimizer))}
    return {
        "state": {index[n]: s for n, s in keyed["state"].items()},
        "param_groups": [{**g, "params": [index[n] for n in g["params"]]} for g in keyed["param_groups"]],
    }
