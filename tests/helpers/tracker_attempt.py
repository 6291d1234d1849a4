"""One attempt of a tracker run in a process of its own, ended as a test asks: used by tests/trackers/.

    python tests/helpers/tracker_attempt.py '{"tracker": "wandb", "run_dir": ..., "first": 1, "last": 7, "end": "kill"}'

Keys: tracker ("wandb", "mlflow"), settings (the tracker's Settings), run_dir, tracker_id (null: a new run),
first, last (the steps logged: a train and a val row each, skipping what the tracker holds), end:
  kill       print {"id": ...} then SIGKILL this process (as kill -9: no clean-up, W&B's core process dies with it)
  close      close("completed") and print {"id": ..., "held": ...}
  full_log   after the rows, the store's files may not grow (RLIMIT_FSIZE 0, for this process and W&B's core
             process), log one more row, then close; print what each call raised
  core_full  the same with the limit on W&B's core process only (the writer of its files)
  core_dead  after the rows, W&B's core process is killed; log one more row and close; print what each raised
"""

import json
import os
import resource
import signal
import sys
from pathlib import Path

if not __package__:  # run as a script: tests/ first on the path (not helpers/, whose module names are common)
    sys.path[0] = str(Path(__file__).resolve().parents[1])
from helpers.trackers import make_start, make_tracker, rows  # noqa: E402

spec = json.loads(sys.argv[1])
tracker = make_tracker(spec["tracker"], **spec.get("settings", {}))
tracker_id = tracker.start(make_start(Path(spec["run_dir"]), tracker_id=spec.get("tracker_id")))
held = tracker.held()
for split, step, values in rows(spec["first"], spec["last"]):
    if (split, step) not in held:
        tracker.log(split, step, values)


def children() -> list[int]:
    return [int(pid) for pid in Path(f"/proc/{os.getpid()}/task/{os.getpid()}/children").read_text().split()]


def outcome(call) -> dict:
    try:
        call()
        return {"raised": None}
    except BaseException as error:  # what kind it is, is what the test asks
        return {"raised": [c.__name__ for c in type(error).__mro__], "message": str(error)}


end = spec["end"]
if end == "kill":
    print(json.dumps({"id": tracker_id}), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
if end in ("full_log", "core_full"):
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead of killing
    for pid in [os.getpid(), *children()] if end == "full_log" else children():
        resource.prlimit(pid, resource.RLIMIT_FSIZE, (0, resource.RLIM_INFINITY))
if end == "core_dead":
    for pid in children():
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
report = {"id": tracker_id}
if end in ("full_log", "core_full", "core_dead"):
    report["log"] = outcome(lambda: tracker.log("train", spec["last"] + 1, {"loss": 0.5}))
    report["close"] = outcome(lambda: tracker.close("completed"))
else:
    tracker.close("completed")
    report["held"] = sorted(tracker.held()) if spec["tracker"] == "mlflow" else None
print(json.dumps(report), flush=True)
