"""One command that checks and measures vit-train's CUDA paths on a GPU, in under 9 minutes on an
H200, and writes one JSON file and one Markdown table (printed too). docs/gpu.md explains the figures.

    python scripts/gpu_acceptance.py --out results/          # on a CUDA GPU
    python scripts/gpu_acceptance.py --smoke --out results/  # every part on the CPU, tiny sizes (CI)

Parts, each in its own process with its own time box (a part that fails or runs out of time is
recorded as such, with what it had measured, and the next part runs):

1. correctness: vit-train on `shapes` with precision auto (bf16), the on-device pipeline and fused
   AdamW; an injected NaN batch skipped and counted; SIGTERM + resume=auto against an uninterrupted
   run; vit-eval reproduces the top-1; torchrun with one process; a DDP step with NCCL; compile.
2. data: on-device pipeline vs DataLoader (16 workers) on CIFAR-shaped data, the data-wait share of
   a ViT-Ti/4 run with each, a folder of generated JPEGs through the loader at 224.
   decode: a folder of photo-like 500x375 JPEGs at 224 with aug=deit, data.decode=gpu (nvJPEG, augmented on the
   GPU) against data.decode=cpu (16 loader workers), beside ViT-S/16's training rate; nvJPEG's pixels against the
   CPU decoder's; the fallbacks counted on a folder of CMYK, progressive, PNG-named-.jpg and truncated files.
   recipe: the cifar10_vit_tiny recipe at batch 128 for 600 steps three ways, the eager step, the compiled model
   and the compiled step (trainer.compile_scope=step, reduce-overhead: one CUDA graph): images/s, MFU, data wait,
   compile seconds, the compiled step's losses against the eager ones; timm's train.py on the same recipe
   (--timm-train PATH: train.py is not in timm's wheel).
3. e2e: the cifar10_vit_tiny recipe on a generated CIFAR-format folder for ~3 minutes: seconds per
   epoch, and how much of it waits for data, computes, evaluates.
4. throughput: bf16 training images/s and MFU for ViT-Ti/4 @32, ViT-S/16 and ViT-B/16 @224, eager
   and compiled, against timm's VisionTransformer of the same shape (it gets the time left).

Exit status 0 when every part passed its checks (the speed targets are reported, not required),
1 when not, 2 when the command cannot run (no GPU without --smoke).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # scripts/: the acceptance package

from acceptance.record import CHILD, ROOT, run_command  # noqa: E402
from acceptance.report import build_report, markdown  # noqa: E402

# Part: (nominal time box in seconds, least worth starting with); None: all the time left.
BOXES = {"correctness": (110, 45), "data": (70, 30), "recipe": (270, 120), "decode": (90, 40), "e2e": (170, 60),
         "throughput": (None, 45)}
SMOKE_BOX = 900  # the CPU is slow and shared; a smoke part has this long
BUDGET = 535  # seconds for the whole run on a GPU: under 9 minutes (every part: give --budget 900 and two calls'
# time, or a subset: --parts recipe,decode fits 6 minutes)
MARGIN = 8  # a part's own deadline comes this long before it is killed
LOG_TAIL = 200_000  # characters of each log copied next to the report


def plan(names: list[str], left: float, smoke: bool) -> dict[str, float]:
    """Each part's time box: its nominal box, but never so long that the parts after it get less
    than the least worth starting them with; the last part with no box gets the rest."""
    boxes = {}
    for i, name in enumerate(names):
        later = sum(BOXES[n][1] for n in names[i + 1:])
        nominal = SMOKE_BOX if smoke else BOXES[name][0]
        boxes[name] = min(nominal if nominal is not None else left, left - later)
        left -= boxes[name]
    return boxes


def run_part(name: str, box: float, work: Path, smoke: bool) -> dict:
    """Run one part in its own process group, killed after `box` seconds; its result file, with
    "status" (passed, failed, timeout, error), "seconds" and "box_s" added."""
    result, log = work / f"{name}.json", work / "logs" / f"{name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, str(CHILD), "part", name, "--result", str(result), "--work", str(work / name),
            "--deadline", str(time.time() + box - MARGIN), *(["--smoke"] if smoke else [])]
    done = run_command(argv, work, box, log, grace=5)
    part = json.loads(result.read_text()) if result.exists() else {"checks": {}, "figures": {}, "notes": []}
    if done.returncode is None:
        status = "timeout"
        part.setdefault("error", f"killed at the end of its {box:.0f} s time box")
    elif done.returncode != 0 or not result.exists():
        status = "error"
        part.setdefault("error", done.tail(6))
    else:
        status = "passed" if all(c["ok"] for c in part["checks"].values()) and part["checks"] else "failed"
    return {"status": status, "seconds": round(done.seconds, 1), "box_s": round(box), **part}


def write(out: Path, report: dict) -> str:
    table = markdown(report)
    (out / "acceptance.json").write_text(json.dumps(report, indent=2, allow_nan=False) + "\n")
    (out / "acceptance.md").write_text(table)
    return table


def copy_logs(work: Path, out: Path) -> None:
    """The parts' and their commands' output (the end of each), next to the report."""
    with open(out / "acceptance.log", "w") as f:
        for path in sorted(work.glob("logs/*.log")) + sorted(work.glob("*/commands.log")) + sorted(work.glob("*/e2e.log")):
            f.write(f"===== {path.relative_to(work)}\n{path.read_text(errors='replace')[-LOG_TAIL:]}\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="every part on the CPU with tiny sizes (CI)")
    parser.add_argument("--out", default="acceptance", help="folder for acceptance.json, .md and .log")
    parser.add_argument("--work", default=None, help="scratch folder (default: a temporary one, removed after)")
    parser.add_argument("--parts", default=",".join(BOXES), help=f"comma-separated, in this order: {','.join(BOXES)}")
    parser.add_argument("--budget", type=float, default=None, help=f"seconds in all (default {BUDGET}; smoke: more)")
    parser.add_argument("--timm-train", default=None, help="timm's train.py (from pytorch-image-models at the tag of "
                        "the installed timm; not in its wheel), for the recipe part's comparison")
    args = parser.parse_args()
    if args.timm_train:
        os.environ["ACCEPTANCE_TIMM_TRAIN"] = str(Path(args.timm_train).resolve())
    names = [n.strip() for n in args.parts.split(",") if n.strip()]
    unknown = sorted(set(names) - set(BOXES))
    if unknown or not names:
        print(f"gpu_acceptance: error: unknown part {', '.join(unknown) or '(none)'}; parts: {', '.join(BOXES)}",
              file=sys.stderr)
        return 2
    import torch

    if not args.smoke and not torch.cuda.is_available():
        print("gpu_acceptance: error: no CUDA GPU is visible; run it on a GPU machine, or add --smoke to run every "
              "part on the CPU with tiny sizes", file=sys.stderr)
        return 2
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    os.environ["PYTHONUNBUFFERED"] = "1"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="vit-acceptance-"))
    work.mkdir(parents=True, exist_ok=True)
    budget = args.budget or (SMOKE_BOX * len(names) if args.smoke else BUDGET)
    start = time.time()
    setting = {"smoke": args.smoke, "budget_s": budget, "parts": names, "started": time.strftime("%Y-%m-%d %H:%M:%S"),
               "torch": torch.__version__, "device": "cpu" if args.smoke else "cuda"}
    parts: dict[str, dict] = {}
    try:
        for i, name in enumerate(names):  # each box planned when its part starts: time saved goes to later parts
            box = plan(names[i:], budget - (time.time() - start) - 5, args.smoke)[name]
            if box < BOXES[name][1] / 2:
                parts[name] = {"status": "skipped", "error": "no time left in the budget", "checks": {}, "figures": {}}
            else:
                parts[name] = run_part(name, box, work, args.smoke)
                setting.update({k: v for k, v in parts[name].get("environment", {}).items() if v is not None})
            print(f"{name}: {parts[name]['status']} ({parts[name].get('seconds', 0):.0f} s)", flush=True)
            setting["seconds"] = time.time() - start
            write(out, build_report(setting, parts))
        table = write(out, build_report(setting, parts))
        copy_logs(work, out)
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
    print(table)
    return 0 if all(p["status"] == "passed" for p in parts.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
