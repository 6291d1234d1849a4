"""The processes scripts/gpu_acceptance.py starts:

    child.py part NAME --result FILE --work DIR --deadline UNIX_TIME [--smoke]   one part
    child.py launch [--nan-at N] [--stop-at N] -- OVERRIDES...                    vit-train with a fault
    child.py ddp                                                                 under torchrun: DDP step

`launch` is `vit-train OVERRIDES` with the on-device pipeline's batch N (0-based, counted over the
run) replaced by NaNs, and/or a SIGTERM sent to itself while batch N is fetched: the loop finishes
that step, checkpoints and stops, as when a cluster pre-empts the job.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import signal
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/: the acceptance package

from acceptance.record import Recorder, end_running  # noqa: E402

PARTS = {"correctness": "acceptance.correctness", "throughput": "acceptance.throughput",
         "data": "acceptance.feeding", "e2e": "acceptance.feeding", "decode": "acceptance.decode",
         "recipe": "acceptance.recipe"}


def part(args: argparse.Namespace) -> int:
    import torch

    signal.signal(signal.SIGTERM, end_running)  # killed at the end of the time box: its commands too
    device = "cpu" if args.smoke or not torch.cuda.is_available() else "cuda"
    rec = Recorder(Path(args.result), Path(args.work), args.deadline, args.smoke, device)
    rec.set("environment", {"device": device, "gpu": torch.cuda.get_device_name() if device == "cuda" else None,
                            "torch": torch.__version__, "cuda": torch.version.cuda, "python": sys.version.split()[0],
                            "cpus": os.cpu_count()})
    try:
        getattr(importlib.import_module(PARTS[args.name]), f"run_{args.name}")(rec)
    except Exception:  # noqa: BLE001 - recorded: the report shows the part failed and why
        rec.set("error", traceback.format_exc(limit=-4).strip())
        return 1
    return 0


def launch(args: argparse.Namespace) -> None:
    import torch

    from vit_train.data.device.pipeline import DeviceTrainPipeline

    batches = DeviceTrainPipeline.__iter__
    fetched = [0]

    def faulty(self):
        for batch in batches(self):  # (images, labels, ...)
            index, fetched[0] = fetched[0], fetched[0] + 1
            if index == args.nan_at:
                batch = (torch.full_like(batch[0], float("nan")), *batch[1:])
            if index == args.stop_at:
                os.kill(os.getpid(), signal.SIGTERM)
            yield batch

    DeviceTrainPipeline.__iter__ = faulty
    sys.argv = ["vit-train", *args.overrides]
    from vit_train.cli.train import train_main

    train_main()


def ddp(args: argparse.Namespace) -> None:
    """One bf16 DistributedDataParallel training step of a vit_micro under torchrun (NCCL on a GPU,
    gloo on the CPU), an all-reduce and an object broadcast; prints one JSON line."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from vit_train.models.families.vit import ViT

    cuda = torch.cuda.is_available() and not args.cpu
    local = int(os.environ["LOCAL_RANK"])
    device = torch.device("cuda", local) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo", device_id=device if cuda else None)
    model = ViT(img_size=32, patch_size=4).build(10).to(device)
    wrapped = DistributedDataParallel(model, device_ids=[local] if cuda else None)
    images, labels = torch.randn(16, 3, 32, 32, device=device), torch.randint(0, 10, (16,), device=device)
    with torch.autocast(device.type, dtype=torch.bfloat16):
        loss = torch.nn.functional.cross_entropy(wrapped(images), labels)
    loss.backward()
    total = torch.ones(1, device=device)
    dist.all_reduce(total)
    box = [{"rank": dist.get_rank()}]
    dist.broadcast_object_list(box, src=0)
    grads = all(p.grad is not None and bool(torch.isfinite(p.grad).all()) for p in model.parameters())
    print(json.dumps({"backend": dist.get_backend(), "world_size": dist.get_world_size(), "loss": loss.item(),
                      "all_reduce": total.item(), "broadcast": box[0], "grads_finite": grads}))
    dist.destroy_process_group()


def main() -> int:
    parser = argparse.ArgumentParser(description="one process of scripts/gpu_acceptance.py")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("part")
    p.add_argument("name", choices=sorted(PARTS))
    p.add_argument("--result", required=True)
    p.add_argument("--work", required=True)
    p.add_argument("--deadline", type=float, default=time.time() + 600)
    p.add_argument("--smoke", action="store_true")
    p = sub.add_parser("launch")
    p.add_argument("--nan-at", type=int, default=None)
    p.add_argument("--stop-at", type=int, default=None)
    p.add_argument("overrides", nargs="*")
    p = sub.add_parser("ddp")
    p.add_argument("--cpu", action="store_true")
    args = parser.parse_args()
    if args.command == "part":
        return part(args)
    if args.command == "launch":
        launch(args)
        return 0
    ddp(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
