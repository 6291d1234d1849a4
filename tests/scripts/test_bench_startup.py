"""scripts/bench_startup.py times the answers before a run beside `import torch` (its figures are quoted in
docs/speed.md, not asserted): one row a command, each a ratio to `import torch` of the same rounds, and the load."""

import re
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_startup.py"


def test_the_benchmark_times_each_command_beside_import_torch():
    done = subprocess.run([sys.executable, str(SCRIPT), "--runs", "1"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    rows = [[cell.strip() for cell in line.split("|")[1:-1]] for line in lines[2:6]]
    assert lines[:2] == ["| command | median s | x import torch |", "|---|---:|---:|"]
    assert [row[0] for row in rows] == ['`python -c "import torch"`', "`vit-train data=nope`", "`vit-train --help`",
                                        "`vit-train --cfg job`"]
    assert rows[0][2] == "1.00"
    for label, seconds, ratio in rows:  # the ratio of the medians, printed as the seconds are, to 0.01
        assert abs(float(seconds) / float(rows[0][1]) - float(ratio)) <= 0.01, (label, seconds, ratio)
    assert re.fullmatch(r"1 rounds, interleaved; Python [\d.]+, \d+ CPUs; load averages \(1, 5, 15 min\) "
                        r"[\d.]+ [\d.]+ [\d.]+ before, [\d.]+ [\d.]+ [\d.]+ after", lines[-1]), lines[-1]


def test_the_benchmark_refuses_no_rounds():
    done = subprocess.run([sys.executable, str(SCRIPT), "--runs", "0"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stderr.splitlines()[-1].endswith("error: --runs must be at least 1")
