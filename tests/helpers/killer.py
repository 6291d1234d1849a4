"""Run `train()` in this process and end it with a real SIGKILL at one chosen moment (no clean-up
code runs, as with kill -9 or the OOM killer), or with "signal": "STOP" pause it there (a second
writer is tried meanwhile; SIGCONT lets it go on). Used by test_faults.py and tests/faults/fault_table.py:

    python tests/helpers/killer.py '{"run_dir": ..., "sections": {...}, "fault": "row", "n": 2}'

"imports": [[folder, module], ...] imports each module from its folder first (a user's own options, registered as
the module is imported: tests/config/test_own_options_killed.py).

Faults (the n-th occurrence):
  row       after the n-th train row is written to metrics.jsonl
  val_row   after the n-th val row is written
  mid_write while a checkpoint's temporary file is half written
  tmp_done  when a checkpoint's temporary file is complete, before it is renamed into place
  renamed   right after a checkpoint is renamed into place (before its step_N/best links)
  results   when results.json is about to be written (after the final checkpoint)
"""

import io
import json
import os
import signal
import sys
from pathlib import Path

import torch

if not __package__:  # run as a script: tests/ first on the path (not helpers/, whose module names are common)
    sys.path[0] = str(Path(__file__).resolve().parents[1])
from helpers.configs import tiny_config  # noqa: E402

import vit_train.outputs.metrics as metrics
import vit_train.train.trainer as trainer


def arm(fault: str, n: int, stop_with: int = signal.SIGKILL) -> None:
    """Make this process send itself `stop_with` at the n-th occurrence of `fault` (patches the
    functions involved; meant for a process that exists to be killed: a child, or this script)."""
    count = {"n": 0}

    def kill_on_nth() -> None:
        count["n"] += 1
        if count["n"] == n:
            sys.stdout.flush()
            os.kill(os.getpid(), stop_with)

    if fault in ("row", "val_row"):
        real_scalars = metrics.RunLogger.scalars

        def scalars(self, split, step, values):
            real_scalars(self, split, step, values)
            if split == ("train" if fault == "row" else "val"):
                kill_on_nth()

        metrics.RunLogger.scalars = scalars
    elif fault == "mid_write":
        real_save = torch.save

        def save(state, f, *args, **kwargs):
            if not hasattr(f, "write"):
                return real_save(state, f, *args, **kwargs)
            buffer = io.BytesIO()
            real_save(state, buffer, *args, **kwargs)
            data = buffer.getvalue()
            f.write(data[: len(data) // 2])
            f.flush()
            kill_on_nth()
            f.write(data[len(data) // 2:])

        torch.save = save
    elif fault in ("tmp_done", "renamed"):
        real_replace = os.replace

        def replace(src, dst, *args, **kwargs):
            if not str(src).endswith(".pt.tmp") or Path(dst).name != "last.pt":
                return real_replace(src, dst, *args, **kwargs)
            if fault == "tmp_done":
                kill_on_nth()
            real_replace(src, dst, *args, **kwargs)
            if fault == "renamed":
                kill_on_nth()

        os.replace = replace
    elif fault == "results":
        real_write = trainer.write_results

        def write_results(run_dir, results):
            kill_on_nth()
            real_write(run_dir, results)

        trainer.write_results = write_results
    else:
        raise SystemExit(f"unknown fault {fault}")


if __name__ == "__main__":
    spec = json.loads(sys.argv[1])
    for folder, module in spec.get("imports", []):  # a user's options, outside vit_train
        sys.path.insert(0, folder)
        __import__(module)
    # STOP: paused there until SIGCONT, then it goes on
    arm(spec["fault"], spec.get("n", 1), getattr(signal, "SIG" + spec.get("signal", "KILL")))
    trainer.train(tiny_config(**spec["sections"], resume=spec.get("resume")), spec["run_dir"])
    print("ended without the fault")
