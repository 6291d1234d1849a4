"""MAE where it is meant to help: many unlabelled images, few labelled ones (docs/mae.md, "Does it help?").

Three `vit-train` runs, each printed before it starts, on the built-in shapes data with the quick
start's micro ViT (mean pooling, fixed 2-D sin-cos positions):

1. MAE pre-training on `--unlabelled` shapes images (no labels read);
2. fine-tuning that encoder on `--labelled` labelled images (model.pretrained=<run 1>);
3. the same fine-tuning command from a random initialisation (from scratch).

Runs 2 and 3 differ in model.pretrained only, and are scored on the same 2,000 val images. The
labelled images are a separate draw of the same generator (shapes' images depend on the seed and on
data.train_size), so none of them was among the pre-training images. Prints a Markdown table of
top-1 (best over the evaluations and at the end), the commands, and the load average.

    python scripts/mae_demo.py                                  # ~10 min on 2 CPU cores
    python scripts/mae_demo.py --labelled 1000 --out outputs/mae_few_labels
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

MODEL = ["model.pool=mean", "model.pos_embed=sincos2d"]  # as the quick start (configs/experiment/quickstart.yaml)


def commands(out: Path, unlabelled: int, labelled: int, pretrain_epochs: int, finetune_epochs: int,
             seed: int) -> dict[str, list[str]]:
    """The three runs' vit-train arguments, by name."""
    common = [*MODEL, "data=shapes", f"seed={seed}", "trainer.progress=false"]
    finetune = [*common, f"data.train_size={labelled}", "data.val_size=2000", "data.batch_size=64",
                "optim.lr=2e-3", f"trainer.epochs={finetune_epochs}", "schedule.warmup_epochs=1",
                f"trainer.eval_every={-(-labelled // 64) * 5}"]
    return {
        "pretrain": ["objective=mae", *common, f"data.train_size={unlabelled}", "data.val_size=500",
                     "data.batch_size=64", "optim.lr=2e-3", f"trainer.epochs={pretrain_epochs}",
                     "schedule.warmup_epochs=0.5", f"hydra.run.dir={out / 'pretrain'}"],
        "finetune": [*finetune, f"model.pretrained={out / 'pretrain'}", f"hydra.run.dir={out / 'finetune'}"],
        "scratch": [*finetune, f"hydra.run.dir={out / 'scratch'}"],
    }


def run(name: str, args: list[str]) -> dict:
    """Run `vit-train ARGS`, print the command first; its results.json and wall time."""
    command = ["vit-train", *args]
    print(f"$ {shlex.join(command)}", flush=True)
    started = time.time()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    results = json.loads((Path(args[-1].split("=", 1)[1]) / "results.json").read_text())
    results["seconds"] = time.time() - started
    print(f"  {name}: {time.time() - started:.0f} s", flush=True)
    return results


def percent(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}%"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="outputs/mae_few_labels", help="folder for the three runs")
    parser.add_argument("--unlabelled", type=int, default=10000, help="pre-training images (no labels)")
    parser.add_argument("--labelled", type=int, default=500, help="labelled fine-tuning images")
    parser.add_argument("--pretrain-epochs", type=int, default=10)
    parser.add_argument("--finetune-epochs", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    out = Path(args.out)
    if out.exists() and any(out.iterdir()):
        sys.exit(f"{out} is not empty: give another --out, or remove it")
    plan = commands(out, args.unlabelled, args.labelled, args.pretrain_epochs, args.finetune_epochs, args.seed)
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    results = {name: run(name, argv) for name, argv in plan.items()}
    print(f"\nload average (1 min) at start {load[0]:.2f}, at the end {os.getloadavg()[0]:.2f}" if load else "")
    print(f"\n| run | labelled images | best top-1 | final top-1 | wall s |\n|---|---|---|---|---|")
    print(f"| MAE pre-training ({args.unlabelled} unlabelled images) | 0 | val reconstruction loss "
          f"{results['pretrain']['final_loss']:.4f} | | {results['pretrain']['seconds']:.0f} |")
    for name, title in (("finetune", "fine-tuned from the MAE encoder"), ("scratch", "from scratch")):
        r = results[name]
        print(f"| {title} | {args.labelled} | {percent(r['best_top1'])} | {percent(r['final_top1'])} | "
              f"{r['seconds']:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
