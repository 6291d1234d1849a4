"""The quick start's training speed with the default CPU threads against each fixed thread count,
on an idle machine and beside busy processes (docs/speed.md, "CPU threads per process").

Each measurement is a real `train()` of `vit-train experiment=quickstart` (its micro ViT, its shapes
data, batch 64) for a fixed number of steps, with a small val set so that the final evaluation
costs little; steps/s come from the run's own training time (results.json's images/s, which leaves
out building and evaluating, over the batch size). The settings run interleaved, round after round,
in one process, first with nothing of ours beside them ("idle"), then beside `--busy` pure-Python
spin loops this script starts and stops itself ("busy"); each setting's median is given as a ratio
to the best median of the same condition. Prints a Markdown table, the CPU and the load averages.

    python scripts/bench_threads.py                    # 20 steps, 3 rounds, 2 busy processes
    python scripts/bench_threads.py --steps 10 --rounds 1 --json bench.json   # a quick look
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from vit_train.cli.train import _config_dir
from vit_train.config import Config
from vit_train.runtime.cpu import usable_cpus
from vit_train.train.trainer import train


def quickstart(steps: int, threads: int | None) -> Config:
    """The quick start's composed config, cut to `steps` training steps, `threads` (None: default)."""
    with initialize_config_dir(config_dir=str(_config_dir()), version_base="1.3"):
        plain = OmegaConf.to_container(compose("train", overrides=["experiment=quickstart"]), resolve=True)
    plain["trainer"].update(max_steps=steps, cpu_threads=threads, progress=False, log_every=10 ** 6,
                            device="cpu")
    plain["data"]["val_size"] = 64  # the one final evaluation; training does not read the val set
    return Config.from_dict(plain)


def steps_per_second(steps: int, threads: int | None) -> tuple[float, int]:
    """(training steps/s, the thread count the run used) of one short quick-start run."""
    cfg = quickstart(steps, threads)
    with tempfile.TemporaryDirectory() as run_dir:
        results = train(cfg, run_dir)
    return results["images_per_s"] / cfg.data.batch_size, torch.get_num_threads()


def measure(settings: list[int | None], steps: int, rounds: int) -> dict:
    """{setting: (median steps/s, [threads used per round])}, the settings interleaved per round."""
    rates: dict = {s: [] for s in settings}
    used: dict = {s: [] for s in settings}
    for _ in range(rounds):
        for s in settings:
            rate, n = steps_per_second(steps, s)
            rates[s].append(rate)
            used[s].append(n)
    return {s: (statistics.median(rates[s]), used[s]) for s in settings}


def spinners(n: int) -> list[subprocess.Popen]:
    """`n` processes that keep a CPU each busy until terminated."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def cpu_model() -> str:
    try:
        for line in open("/proc/cpuinfo", encoding="utf-8"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def load() -> str:
    return "%.2f %.2f %.2f" % os.getloadavg() if hasattr(os, "getloadavg") else "n/a"


def table(results: dict, busy: int) -> str:
    """The Markdown table: a row per setting, steps/s and ratio to the condition's best, per condition."""
    head = ["threads", "idle steps/s", "idle / best", f"{busy} busy: steps/s", f"{busy} busy / best"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    best = {c: max(rate for rate, _ in results[c].values()) for c in results}
    for s in results["idle"]:
        cells = []
        for c in ("idle", "busy"):
            rate, used = results[c][s]
            cells += [f"{rate:.2f}", f"{rate / best[c]:.2f}"]
        name = str(s) if s is not None else "default (chose %s idle; %s busy)" % (
            ",".join(map(str, results["idle"][s][1])), ",".join(map(str, results["busy"][s][1])))
        lines.append("| " + " | ".join([name] + cells) + " |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20, help="training steps per measurement")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per condition (median)")
    parser.add_argument("--busy", type=int, default=2, help="spin-loop processes beside the busy condition")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    logging.getLogger("vit_train").setLevel(logging.WARNING)  # the runs' INFO lines would bury the table
    os.environ.pop("OMP_NUM_THREADS", None)  # the default must choose by itself
    cpus = usable_cpus()
    settings: list[int | None] = [None, *range(1, cpus + 1)]
    loads, results, started = {}, {}, time.time()
    loads["idle"] = [load()]
    results["idle"] = measure(settings, args.steps, args.rounds)
    loads["idle"].append(load())
    procs = spinners(args.busy)
    try:
        time.sleep(1.0)  # running before the first run samples the load
        loads["busy"] = [load()]
        results["busy"] = measure(settings, args.steps, args.rounds)
        loads["busy"].append(load())
    finally:
        for p in procs:
            p.terminate()
            p.wait()
    print(f"CPU: {cpu_model()}, {cpus} usable CPUs (os.cpu_count() {os.cpu_count()}); torch {torch.__version__}")
    print(f"quick start, {args.steps} steps per measurement, median of {args.rounds} rounds; "
          f"{time.time() - started:.0f} s in all")
    print(f"load averages (1, 5, 15 min): idle {loads['idle'][0]} -> {loads['idle'][1]}; "
          f"busy {loads['busy'][0]} -> {loads['busy'][1]}\n")
    print(table(results, args.busy))
    if args.json:
        plain = {c: {str(s): {"steps_per_s": r, "threads": u} for s, (r, u) in results[c].items()} for c in results}
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"cpu": cpu_model(), "cpus": cpus, "loads": loads, "results": plain}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
