"""How long vit-train takes to answer before any training: a one-line config error, `--help` and `--cfg job`, each
beside `python -c "import torch"` (docs/speed.md, "Start-up").

Each command is a fresh process of this Python with this checkout first on the path (`vit-train` is
`python -m vit_train`), started from an empty temporary folder. The commands run in turn, --runs rounds
(interleaved: a change in the machine's load touches every command alike); the table gives each command's
median wall time and its ratio to the median of `import torch` measured in the same rounds, with the load
averages (os.getloadavg) before and after. A command whose exit status is not the expected one stops the script:
a failing command is not timed.

    python scripts/bench_startup.py              # 7 rounds
    python scripts/bench_startup.py --runs 15
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# (label, arguments after the Python executable, the exit status it must end with)
COMMANDS = [
    ('python -c "import torch"', ["-c", "import torch"], 0),
    ("vit-train data=nope", ["-m", "vit_train", "data=nope"], 2),  # a one-line config error
    ("vit-train --help", ["-m", "vit_train", "--help"], 0),
    ("vit-train --cfg job", ["-m", "vit_train", "--cfg", "job"], 0),
]


def timed(args: list[str], expected: int, cwd: str, env: dict[str, str]) -> float:
    """Seconds one run of `python args` takes; RuntimeError naming the command when it ends otherwise than `expected`."""
    start = time.perf_counter()
    done = subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != expected:
        last = (done.stderr.strip().splitlines() or ["(nothing on stderr)"])[-1]
        raise RuntimeError(f"python {' '.join(args)} exited {done.returncode}, not {expected}: {last}")
    return seconds


def measure(commands: list[tuple[str, list[str], int]], runs: int) -> dict[str, list[float]]:
    """{label: the seconds of each round}: every command once per round, in the order given."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    seconds: dict[str, list[float]] = {label: [] for label, _, _ in commands}
    with tempfile.TemporaryDirectory() as cwd:
        for _ in range(runs):
            for label, args, expected in commands:
                seconds[label].append(timed(args, expected, cwd, env))
    return seconds


def table(seconds: dict[str, list[float]]) -> str:
    """A Markdown table: each command's median seconds and its ratio to the first command's median."""
    base = statistics.median(next(iter(seconds.values())))
    rows = ["| command | median s | x import torch |", "|---|---:|---:|"]
    for label, values in seconds.items():
        median = statistics.median(values)
        rows.append(f"| `{label}` | {median:.2f} | {median / base:.2f} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7, help="rounds of every command (default 7)")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    before = os.getloadavg()
    seconds = measure(COMMANDS, args.runs)
    after = os.getloadavg()
    print(table(seconds))
    print(f"\n{args.runs} rounds, interleaved; Python {platform.python_version()}, {os.cpu_count()} CPUs; load averages "
          f"(1, 5, 15 min) {' '.join(f'{v:.2f}' for v in before)} before, {' '.join(f'{v:.2f}' for v in after)} after")


if __name__ == "__main__":
    main()
