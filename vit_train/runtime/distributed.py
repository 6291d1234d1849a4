"""Several processes (torchrun): the process group, rank helpers and the reductions the loop needs.

torchrun (also one per node under SLURM's srun) sets RANK, LOCAL_RANK and WORLD_SIZE; so does
`from_slurm` for processes that SLURM starts itself, one task per GPU (srun without torchrun, or
Hydra's submitit launcher with tasks_per_node > 1). `setup` joins the group (NCCL on CUDA, gloo on
the CPU) and pins each process to its GPU. Without either, everything here is a no-op: world
size 1, rank 0.
"""

from __future__ import annotations

import gc
import os
import subprocess
from contextlib import nullcontext
from dataclasses import dataclass

import torch
import torch.distributed as dist

from vit_train.errors import ConfigError


@dataclass(frozen=True)
class Context:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


_context = Context()


def launched() -> bool:
    """True in a process started by torchrun (or as one of several SLURM tasks) with more than one process in all."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def from_slurm(env: dict | None = None) -> None:
    """Fill torchrun's variables from SLURM's when SLURM started several tasks and torchrun did not."""
    env = os.environ if env is None else env
    if "RANK" in env or int(env.get("SLURM_NTASKS", "1")) < 2 or "SLURM_PROCID" not in env:
        return
    env.update(RANK=env["SLURM_PROCID"], LOCAL_RANK=env.get("SLURM_LOCALID", "0"), WORLD_SIZE=env["SLURM_NTASKS"])
    if "MASTER_ADDR" not in env:  # the job's first node
        nodes = subprocess.run(
            ["scontrol", "show", "hostnames", env["SLURM_JOB_NODELIST"]], capture_output=True, text=True, check=True
        ).stdout.split()
        env["MASTER_ADDR"] = nodes[0]
    env.setdefault("MASTER_PORT", str(20000 + int(env.get("SLURM_JOB_ID", "0")) % 20000))


def setup(device_name: str) -> Context:
    """Join the process group torchrun describes (once); returns this process's place in it."""
    global _context
    if not launched() or dist.is_initialized():
        return _context
    rank, local_rank, world = (int(os.environ[k]) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE"))
    cuda = device_name != "cpu" and torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(local_rank)
    # The keys of each attempt apart: after an elastic restart (torchrun --max-restarts) the store still
    # holds the previous attempt's addresses, which the new processes would otherwise try to reach.
    store, _, _ = next(dist.rendezvous("env://"))
    store = dist.PrefixStore(f"vit-train/attempt_{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}", store)
    dist.init_process_group(
        "nccl" if cuda else "gloo",
        store=store,
        rank=rank,
        world_size=world,
        device_id=torch.device("cuda", local_rank) if cuda else None,
    )
    _context = Context(rank, local_rank, world)
    return _context


def context() -> Context:
    return _context


def cleanup() -> None:
    """Leave the process group. The run's objects (FSDP's modules and states hold the group in reference
    cycles) are collected first, while the interpreter is whole: left to its finalization, gloo's threads can
    abort the process (SIGABRT after a completed run, seen once in ~150 FSDP launches; pytorch #179291)."""
    global _context
    if dist.is_initialized():
        gc.collect()
        dist.destroy_process_group()
    _context = Context()


def check_batch(batch_size: int, accum_steps: int) -> int:
    """This process's share of the global batch; refuses a batch the processes cannot split evenly."""
    world = _context.world_size
    if batch_size % world or (batch_size // world) % accum_steps:
        raise ConfigError(
            f"data.batch_size ({batch_size}) must split evenly over {world} processes x "
            f"trainer.accum_steps ({accum_steps}); use a multiple of {world * accum_steps}"
        )
    return batch_size // world


def barrier() -> None:
    if _context.enabled:
        dist.barrier()


def sum_all(tensor: torch.Tensor) -> torch.Tensor:
    """Sum over processes, in place (identity for one process)."""
    if _context.enabled:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def broadcast(value):
    """Rank 0's `value` (any picklable object) on every process."""
    if not _context.enabled:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def broadcast_buffers(*modules: torch.nn.Module | None) -> None:
    """Rank 0's buffers of `modules` (BatchNorm's running statistics, an EMA's copies of them) on every
    process, in place; a no-op with one process. The evaluation calls it first: each process evaluates a
    share of the val set, and with another process's statistics the logged score would be of no saved model.
    Rank 0's are the ones checkpoints hold and the ones DDP's broadcast_buffers gives every process at each
    forward (FSDP leaves buffers alone, so there each process's drift apart while training)."""
    if not _context.enabled:
        return
    for module in modules:
        for buffer in module.buffers() if module is not None else []:
            dist.broadcast(buffer, src=0)


def max_all(value: int, device: torch.device) -> int:
    """The largest of the processes' values."""
    if not _context.enabled:
        return value
    tensor = torch.tensor([value], device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return int(tensor.item())


def wrap(model: torch.nn.Module) -> torch.nn.Module:
    """DistributedDataParallel around the model with several processes, else the model itself."""
    if not _context.enabled:
        return model
    from torch.nn.parallel import DistributedDataParallel

    device_ids = [_context.local_rank] if next(model.parameters()).is_cuda else None
    return DistributedDataParallel(model, device_ids=device_ids)


def no_sync(model: torch.nn.Module, last: bool):
    """DDP's no_sync for all but the last micro-batch of an accumulated step (one all-reduce per step);
    FSDP2's set_requires_gradient_sync the same way (one reduce-scatter per step; each block keeps its
    whole gradient between micro-batches)."""
    if not _context.enabled:
        return nullcontext()
    model = getattr(model, "_orig_mod", model)  # through torch.compile's wrapper
    if hasattr(model, "set_requires_gradient_sync"):  # FSDP2 (train/sharding.py)
        model.set_requires_gradient_sync(last)
        return nullcontext()
    return nullcontext() if last else model.no_sync()


def mean_loss_and_hits(loss: torch.Tensor, hits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A step's loss averaged and its top-1 hits summed over processes (one small all-reduce)."""
    if not _context.enabled:
        return loss, hits
    packed = sum_all(torch.stack([loss.float(), hits.float()]))
    return packed[0] / _context.world_size, packed[1].long()
