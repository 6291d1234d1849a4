"""A run that fills a small tmpfs, then resumes after space is freed. Run by test_faults.py in a
private mount namespace (`unshare -m`, or `unshare -rm` as a normal user), where it mounts the tmpfs
itself; writes what happened as JSON to OUT/report.json and copies the run to OUT/run.

    python tests/helpers/diskfull.py OUT SIZE_KB SECTIONS_JSON
"""

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

if not __package__:  # run as a script: tests/ first on the path (not helpers/, whose module names are common)
    sys.path[0] = str(Path(__file__).resolve().parents[1])
from helpers.configs import tiny_config  # noqa: E402

from vit_train.errors import UserError  # noqa: E402
from vit_train.train.trainer import train  # noqa: E402

out, size_kb, sections = Path(sys.argv[1]), int(sys.argv[2]), json.loads(sys.argv[3])
mount = Path(tempfile.mkdtemp())
subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_kb}k", "tmpfs", str(mount)], check=True)
run_dir = mount / "run"
report = {"mount": str(mount)}
try:
    train(tiny_config(**sections), run_dir)
    report["first"] = "completed"
except UserError as e:  # a checkpoint, metrics.jsonl or the events that do not fit
    report["first"] = str(e)
report["results_after_failure"] = json.loads((run_dir / "results.json").read_text()) \
    if (run_dir / "results.json").exists() else None
report["log_after_failure"] = (run_dir / "train.log").read_text() if (run_dir / "train.log").exists() else None
report["checkpoints_after_failure"] = sorted(p.name for p in (run_dir / "checkpoints").glob("*")) \
    if (run_dir / "checkpoints").exists() else []
subprocess.run(["mount", "-o", "remount,size=16m", str(mount)], check=True)  # space freed
train(tiny_config(**sections, resume="auto"), run_dir)
shutil.copytree(run_dir, out / "run")
(out / "report.json").write_text(json.dumps(report))
