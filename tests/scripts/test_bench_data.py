"""scripts/bench_data.py measures each data path it names, pre-resized shards among them (its timings are quoted in
docs/data.md and docs/speed.md, not asserted): the rows, the per-core column, the disk sizes of what it wrote."""

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_data.py"


def test_the_benchmark_measures_folder_shards_pre_resized_shards_and_hf_on_one_core():
    done = subprocess.run([sys.executable, str(SCRIPT), "--images", "40", "--size", "60x45", "--short-side", "24",
                           "--workers", "0", "--rounds", "1", "--batch", "8", "--img-size", "16",
                           "--shuffle-buffer", "8"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "40 training images (written: 60x45 JPEGs), batch 8, 1 core: the main process decodes" in done.stdout
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
            for line in done.stdout.splitlines() if line.startswith("| ") and not line.startswith("| data")}
    assert list(rows) == ["imagefolder", "webdataset", "webdataset short_side=24", "hf"]
    for name, cells in rows.items():
        assert float(cells[0]) > 0 and cells[0] == cells[1], (name, cells)  # one core: images/s is per core
    assert rows["imagefolder"][2] == "1.00" and rows["imagefolder"][-1] == "1.000"
