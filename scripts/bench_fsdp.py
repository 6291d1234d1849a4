"""Memory and time of DDP against FSDP (trainer.strategy=fsdp) and FSDP + grad checkpointing, on the CPU
with gloo, 2 processes (docs/multi-gpu.md quotes its output).

    python scripts/bench_fsdp.py                         # ViT-B/16 and ViT-L/16, batch 2 a process, 224x224
    python scripts/bench_fsdp.py --models vit_huge --strategies fsdp_gc --steps 2
    python scripts/bench_fsdp.py --models vit_micro --img 32 --steps 2   # a smoke run (seconds)

Each (model, strategy) runs in 2 fresh processes (torch.multiprocessing, gloo), so the peak RSS is that
configuration's alone. Per process it reports:
- state: the bytes of parameters + gradients + AdamW state this process holds, counted from its tensors
  (a DTensor's local shard under FSDP), after a step;
- peak RSS: resource.getrusage's ru_maxrss over the process's life (build + steps), the largest of the 2;
- s/step: the median wall time of the timed steps (after one untimed step), forward + backward + AdamW.
A configuration whose DDP state alone (16 bytes a parameter, x 2 processes) would not fit the memory
available (`free`, less 4 GB kept free) is not run, and says so, unless --memory-cap is given:

    python scripts/bench_fsdp.py --models vit_huge --memory-cap 23   # the machine's 23 GB, split in 2

then every configuration runs with each process's address space capped at GB / 2 (setrlimit RLIMIT_AS, so the
machine never swaps or meets the OOM killer), and one that cannot allocate within it is reported with the phase
it failed in (build, shard, forward, backward, optimizer) instead of a time.
"""

from __future__ import annotations

import argparse
import os
import platform
import queue
import resource
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vit_train.config import Config  # noqa: E402

MODELS = {  # the configs/model/*.yaml shapes
    "vit_micro": dict(embed_dim=64, depth=4, num_heads=4, mlp_ratio=2.0, patch_size=4),
    "vit_base": dict(embed_dim=768, depth=12, num_heads=12, mlp_ratio=4.0, patch_size=16),
    "vit_large": dict(embed_dim=1024, depth=24, num_heads=16, mlp_ratio=4.0, patch_size=16),
    "vit_huge": dict(embed_dim=1280, depth=32, num_heads=16, mlp_ratio=4.0, patch_size=14),
}
STRATEGIES = {"ddp": ("ddp", False), "fsdp": ("fsdp", False), "fsdp_gc": ("fsdp", True)}
KEEP_FREE = 4 * 2**30


def _bytes(tensors) -> int:
    total = 0
    for t in tensors:
        local = t.to_local() if hasattr(t, "to_local") else t
        total += local.numel() * local.element_size()
    return total


def _worker(rank: int, world: int, port: int, name: str, strategy: str, args, out) -> None:
    if args.memory_cap:
        cap = int(args.memory_cap * 2**30 / world)
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    try:
        _steps(rank, world, port, name, strategy, args, out)
    except (MemoryError, RuntimeError) as e:  # torch's "DefaultCPUAllocator: can't allocate memory" is a RuntimeError
        if "alloc" not in str(e) and not isinstance(e, MemoryError):
            raise
        out.put(("out of memory", rank, _PHASE[0], (str(e).splitlines() or [type(e).__name__])[0][:120]))


_PHASE = ["start"]


def _at(phase: str) -> None:
    _PHASE[0] = phase


def _steps(rank: int, world: int, port: int, name: str, strategy: str, args, out) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(args.threads)
    from vit_train.runtime import distributed
    from vit_train.train import sharding

    _at("start")
    ctx = distributed.setup("cpu")
    kind, checkpointing = STRATEGIES[strategy]
    cfg = Config.from_dict({"model": {**MODELS[name], "img_size": args.img, "grad_checkpointing": checkpointing},
                            "trainer": {"strategy": kind, "device": "cpu"}})
    torch.manual_seed(0)
    _at("build")
    model = cfg.model.build(1000)
    _at("shard" if kind == "fsdp" else "wrap")
    if kind == "fsdp":
        sharding.shard(model, None, cfg, None)
        step_fn = model
    else:
        step_fn = distributed.wrap(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    images = torch.randn(args.batch, 3, args.img, args.img)
    targets = torch.randint(0, 1000, (args.batch,))
    times = []
    for i in range(args.steps + 1):
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        _at(f"step {i + 1} forward")
        loss = torch.nn.functional.cross_entropy(step_fn(images), targets)
        _at(f"step {i + 1} backward")
        loss.backward()
        _at(f"step {i + 1} optimizer")
        sharding.clip_grad_norm(model.parameters(), 1.0)
        optimizer.step()
        if i:
            times.append(time.perf_counter() - start)
    params = list(model.parameters())
    state = _bytes(params) + _bytes(p.grad for p in params if p.grad is not None) + _bytes(
        v for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    row = torch.tensor([state, peak, statistics.median(times)], dtype=torch.float64)
    rows = [torch.zeros_like(row) for _ in range(world)]
    dist.all_gather(rows, row)
    if rank == 0:
        out.put(("done", [r.tolist() for r in rows]))
    distributed.cleanup()


def _result(out, procs) -> tuple:
    """The first message of the run's processes: ("done", rows) or ("out of memory", rank, phase, message);
    ("died", rank, phase, exit code) if a process ended without one."""
    while True:
        try:
            return out.get(timeout=5)
        except queue.Empty:
            for rank, p in enumerate(procs):
                if p.exitcode not in (None, 0):
                    return ("died", rank, "unknown phase", f"exit code {p.exitcode}")


def _available() -> int:
    with open("/proc/meminfo") as f:
        info = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f}
    return info["MemAvailable"]


def _cpu() -> str:
    with open("/proc/cpuinfo") as f:
        names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
    return names[0] if names else platform.machine()


def _millions(count: int) -> str:
    """A parameter count as the table shows it: 87M, 0.06M."""
    return f"{count / 1e6:.0f}M" if count >= 1e7 else f"{count / 1e6:.2f}M"


def _params(name: str, img: int) -> int:

    cfg = Config.from_dict({"model": {**MODELS[name], "img_size": img}})
    with torch.device("meta"):
        return sum(p.numel() for p in cfg.model.build(1000).parameters())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["vit_base", "vit_large"], choices=list(MODELS))
    parser.add_argument("--strategies", nargs="+", default=list(STRATEGIES), choices=list(STRATEGIES))
    parser.add_argument("--img", type=int, default=224)
    parser.add_argument("--batch", type=int, default=2, help="images per process")
    parser.add_argument("--steps", type=int, default=3, help="timed steps (after one untimed)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process")
    parser.add_argument("--memory-cap", type=float, default=None, metavar="GB",
                        help="run every configuration with the 2 processes' address space capped at GB in all")
    args = parser.parse_args()
    world = 2
    print(f"# {_cpu()}, {os.cpu_count()} cores, torch {torch.__version__}, "
          f"load {os.getloadavg()[0]:.2f}, {_available() / 2**30:.1f} GB available; 2 processes (gloo), "
          f"{args.threads} thread each, batch {args.batch} a process, {args.img}x{args.img}, AdamW, fp32"
          + (f"; address space capped at {args.memory_cap / world:.1f} GB a process" if args.memory_cap else ""))
    print("| model | params | strategy | state / process (MB) | peak RSS / process (GB) | s / step | vs DDP | vs FSDP |")
    print("|---|---|---|---|---|---|---|---|")
    ctx = mp.get_context("spawn")
    for name in args.models:
        count = _params(name, args.img)
        ddp_time = fsdp_time = None
        for strategy in args.strategies:
            needed = 16 * count * world if strategy == "ddp" else 16 * count
            if not args.memory_cap and needed > _available() - KEEP_FREE:
                print(f"| {name} | {_millions(count)} | {strategy} | {needed / world / 2**20:.2f} needed | not run: "
                      f"{needed / 2**30:.1f} GB for 2 processes > {(_available() - KEEP_FREE) / 2**30:.1f} GB | | | |")
                continue
            out = ctx.Queue()
            port = 29500 + (os.getpid() + hash(strategy)) % 1000
            procs = [ctx.Process(target=_worker, args=(r, world, port, name, strategy, args, out), daemon=True)
                     for r in range(world)]
            for p in procs:
                p.start()
            kind, *result = _result(out, procs)
            if kind != "done":
                for p in procs:
                    p.terminate()
                for p in procs:
                    p.join()
                rank, phase, message = result
                print(f"| {name} | {_millions(count)} | {strategy} | {needed / world / 2**20:.2f} needed | "
                      f"{kind} in {phase} (rank {rank}: {message}) | | | |", flush=True)
                continue
            rows = result[0]
            for p in procs:
                p.join()
            state, peak, seconds = max(r[0] for r in rows), max(r[1] for r in rows), max(r[2] for r in rows)
            ddp_time = seconds if strategy == "ddp" else ddp_time
            fsdp_time = seconds if strategy == "fsdp" else fsdp_time
            ratios = [f"{seconds / base:.2f}x" if base else "" for base in (ddp_time, fsdp_time)]
            print(f"| {name} | {_millions(count)} | {strategy} | {state / 2**20:.2f} | {peak / 2**30:.2f} | "
                  f"{seconds:.2f} | {ratios[0]} | {ratios[1]} |", flush=True)


if __name__ == "__main__":
    main()
