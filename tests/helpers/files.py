"""What a run wrote, read back: metrics.jsonl rows, results.json, TensorBoard scalars, checkpoint
weights, every file's bytes; and the comparison of a resumed run (or sweep) with an uninterrupted one:
`assert_same_run` (rows, two TensorBoard tags, last.pt) and the wider oracle
`assert_every_file_as_the_reference` (every file a user reads), `assert_same_sweep` (every job's files,
the records and the summary)."""

from __future__ import annotations

import json
from pathlib import Path


def rows(run_dir: Path) -> list[dict]:
    """All rows of a run's metrics.jsonl, in order."""
    return [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]


def logged(run_dir: Path, split: str) -> list[dict]:
    """The rows of a run's metrics.jsonl for `split` (train, val, val_ema), in order."""
    return [e for e in rows(run_dir) if e["split"] == split]


def trained_rows(run_dir: Path) -> list[dict]:
    """metrics.jsonl's rows but the "compile" ones (per attempt: `COMPILE_SPLIT`), in order."""
    return [r for r in rows(run_dir) if r["split"] != COMPILE_SPLIT]


def read_results(run_dir: Path) -> dict:
    """A run's results.json (a sweep job's directory is a run directory)."""
    return json.loads((Path(run_dir) / "results.json").read_text())


def tb_scalars(run_dir: Path, tag: str) -> list[tuple[int, float]]:
    """Every (step, value) of TensorBoard scalar `tag` under run_dir/tb, as TensorBoard plots them: by step,
    orphaned steps purged."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(Path(run_dir) / "tb"), size_guidance={"scalars": 0})  # purges orphaned steps, as TB does
    acc.Reload()
    return sorted((e.step, e.value) for e in acc.Scalars(tag))  # as TensorBoard plots them: by step


def tb_steps(run_dir: Path, tag: str) -> list[int]:
    """The steps of TensorBoard scalar `tag` under run_dir/tb, in the order the events hold them."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(Path(run_dir) / "tb"))
    events.Reload()
    return [e.step for e in events.Scalars(tag)]


def tb_events(run_dir: Path):
    """TensorBoard's EventAccumulator over run_dir/tb, loaded, every image kept (its .Images(tag), .Tags())."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(Path(run_dir) / "tb"), size_guidance={"images": 0})
    events.Reload()
    return events


def model_weights(run_dir: Path, name: str = "last.pt") -> dict:
    """The model state dict of a run's checkpoints/<name>."""
    import torch

    return torch.load(Path(run_dir) / "checkpoints" / name, weights_only=True)["model"]


def file_bytes(run_dir: Path) -> dict[Path, bytes]:
    """Every file under `run_dir` (relative path -> its bytes): two calls compare byte for byte."""
    run_dir = Path(run_dir)
    return {p.relative_to(run_dir): p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}


def assert_same_run(run_dir, reference, status: str = "completed"):
    """Every (split, step) row once, with the reference's values (an uninterrupted run with the same seed);
    the same TensorBoard scalars, final weights and optimiser state; no temporary files; ended with `status`
    (completed; stopped_early for a run early stopping ends)."""
    import torch

    got, want = (trained_rows(r) for r in (run_dir, reference))
    keys = [(r["split"], r["step"]) for r in got]
    assert len(keys) == len(set(keys)), f"rows logged twice: {sorted(k for k in keys if keys.count(k) > 1)}"
    drop = ("images_per_s", "data_wait", "tflops", "mfu")  # timing
    strip = lambda r: {k: v for k, v in r.items() if k not in drop}  # noqa: E731
    assert sorted(map(strip, got), key=lambda r: (r["step"], r["split"])) == \
        sorted(map(strip, want), key=lambda r: (r["step"], r["split"]))
    for tag in ("train/loss", "val/top1"):  # val/top1: an objective that scores by top-1 (not MAE's)
        if tag in tb_events(reference).Tags()["scalars"]:
            assert tb_scalars(run_dir, tag) == tb_scalars(reference, tag), tag
    a = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    b = torch.load(reference / "checkpoints" / "last.pt", weights_only=True)
    for part in ("model", "optimizer"):
        flat_a, flat_b = (torch.utils._pytree.tree_flatten(x[part])[0] for x in (a, b))
        assert all(torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y for x, y in zip(flat_a, flat_b)), part
    assert not list(run_dir.rglob("*.tmp")), list(run_dir.rglob("*.tmp"))
    assert json.loads((run_dir / "results.json").read_text())["status"] == status


# What differs between two runs with the same seed however they ran: timings, the directory, the run's id.
TIMING_ROW = ("images_per_s", "data_wait", "tflops", "mfu")
TIMING_RESULTS = ("images_per_s", "wall_seconds", "wall_seconds_all_attempts", "compile_seconds", "run_dir", "run_id")
# metrics.jsonl's "compile" rows (TensorBoard's compile/*): seconds trainer.compile took, one row per attempt, at the
# step each attempt compiled at; `assert_compile_rows` checks them, the oracles leave them out
COMPILE_SPLIT = "compile"
# images_seen: the images timed for images/s, which leave out each attempt's compiling step (trainer.compile)
TIMING_CHECKPOINT = ("train_seconds", "images_seen", "wall_seconds", "run_id")
UNSEEDED_RNG = ("python", "numpy")  # a checkpoint's rng entries that start from the OS's randomness in each process
TIMING_TAGS = tuple(f"train/{k}" for k in TIMING_ROW)  # TensorBoard: their steps are compared, not values


def assert_identical(a, b, where: str = "checkpoint") -> None:
    """Tensors equal bit for bit (dtype too), everything else ==, recursively (dict keys, list lengths);
    AssertionError naming the first entry that differs (`where`.key[i]...)."""
    import torch

    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), f"{where}: keys {sorted(set(a) ^ set(b), key=str)}"
        for key in a:
            assert_identical(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), f"{where}: length"
        for i, (x, y) in enumerate(zip(a, b)):
            assert_identical(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def closing_line(run_dir: Path) -> str:
    """train.log's last line without its time stamp, images/s, wall time and directory."""
    import re

    last = (Path(run_dir) / "train.log").read_text().splitlines()[-1]
    return re.sub(r", [\d.]+ images/s, .*$", "", last.split("] ", 1)[-1])


def assert_every_file_as_the_reference(run_dir: Path, reference: Path, status: str = "completed") -> None:
    """Every file a user reads equals the uninterrupted reference run's (same config and seed), but for
    timings, the directory and the run's id: `assert_same_run` (rows, last.pt's weights and optimiser, no
    *.tmp, completed); every metrics.jsonl row in order; every TensorBoard scalar tag (values, and for
    the timing tags their steps); the checkpoint names, and in each (last.pt, best.pt, step files)
    every entry (weights, optimiser, scheduler, torch's RNG, step, best step and score...); results.json;
    best.pt holding the step results.json names; train.log's closing line. AssertionError naming the
    first difference. `status`: how both ended (results.json's)."""
    import torch

    run_dir, reference = Path(run_dir), Path(reference)
    assert_same_run(run_dir, reference, status)
    strip = lambda r: {k: v for k, v in r.items() if k not in TIMING_ROW}  # noqa: E731
    assert [strip(r) for r in trained_rows(run_dir)] == [strip(r) for r in trained_rows(reference)], \
        "metrics.jsonl rows or order"
    got_tb, want_tb = tb_events(run_dir), tb_events(reference)
    tags = [t for t in want_tb.Tags()["scalars"] if not t.startswith(f"{COMPILE_SPLIT}/")]
    assert sorted(t for t in got_tb.Tags()["scalars"] if not t.startswith(f"{COMPILE_SPLIT}/")) == sorted(tags), \
        "TensorBoard scalar tags"
    for tag in tags:
        got = sorted((e.step, e.value) for e in got_tb.Scalars(tag))
        want = sorted((e.step, e.value) for e in want_tb.Scalars(tag))
        if tag in TIMING_TAGS:
            got, want = [s for s, _ in got], [s for s, _ in want]
        assert got == want, f"TensorBoard {tag}"
    names = sorted(p.name for p in (reference / "checkpoints").iterdir())
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == names, "checkpoint names"
    for name in names:
        a, b = (torch.load(r / "checkpoints" / name, weights_only=True) for r in (run_dir, reference))
        for part in (a, b):
            for key in TIMING_CHECKPOINT:
                part.pop(key, None)
            if isinstance(part.get("identity"), dict):
                part["identity"] = {k: v for k, v in part["identity"].items() if k != "run_id"}
            if isinstance(part.get("rng"), dict):  # Python's and NumPy's: never seeded by vit-train, so they
                part["rng"] = {k: v for k, v in part["rng"].items() if k not in UNSEEDED_RNG}  # differ by process
            if isinstance(part.get("train_window"), dict):  # the log window's clock (seconds, data-wait)
                part["train_window"] = {k: v for k, v in part["train_window"].items() if k != "timing"}
            if isinstance(part.get("config"), dict):  # how it was started: resume=auto, or not
                part["config"] = {k: v for k, v in part["config"].items() if k != "resume"}
        assert_identical(a, b, f"checkpoints/{name}")
    got, want = ({k: v for k, v in read_results(r).items() if k not in TIMING_RESULTS} for r in (run_dir, reference))
    assert got == want, f"results.json: {sorted(k for k in want if got.get(k) != want[k])}"
    if got.get("best_step") is not None and (run_dir / "checkpoints" / "best.pt").exists():
        best = torch.load(run_dir / "checkpoints" / "best.pt", weights_only=True)["step"]
        assert best == got["best_step"], f"best.pt holds step {best}, results.json names {got['best_step']}"
    assert closing_line(run_dir) == closing_line(reference), "train.log's closing line"


def sweep_jobs(sweep_dir: Path) -> dict[tuple[str, ...], Path]:
    """A sweep directory's jobs by their overrides (sorted: the same grid in another order is the same job)."""
    import yaml

    jobs = {}
    for job in sorted(Path(sweep_dir).iterdir()):
        record = job / ".hydra" / "overrides.yaml"
        if record.is_file():
            jobs[tuple(sorted(yaml.safe_load(record.read_text()) or []))] = job
    return jobs


def summary_tables(sweep_dir: Path) -> tuple[list[dict], list[list[str]]]:
    """summary.csv's rows and summary.md's table rows (cells), the timing columns left out."""
    import csv
    import io

    sweep_dir = Path(sweep_dir)
    table = list(csv.DictReader(io.StringIO((sweep_dir / "summary.csv").read_text())))
    csv_rows = [{k: v for k, v in r.items() if k not in ("images_per_s", "wall_seconds")} for r in table]
    lines = [line for line in (sweep_dir / "summary.md").read_text().splitlines() if line.startswith("|")]
    heads = [c.strip() for c in lines[0].strip("|").split("|")]
    keep = [i for i, head in enumerate(heads) if head not in ("images/s", "wall s")]
    md_rows = [[c.strip() for c in line.strip("|").split("|")] for line in lines]
    rest = [line for line in (sweep_dir / "summary.md").read_text().splitlines() if not line.startswith("|")]
    return csv_rows, [[cells[i] for i in keep] for cells in md_rows if len(cells) == len(heads)] + [rest]


def assert_same_sweep(sweep_dir: Path, reference: Path) -> None:
    """A sweep's files equal an uninterrupted sweep's: the same jobs (by their overrides), each job's files
    (`assert_every_file_as_the_reference`), no refusal record (refused.json) left beside any, and the
    summary (summary.csv, summary.md) the same but for timing columns."""
    got, want = sweep_jobs(sweep_dir), sweep_jobs(reference)
    assert sorted(got) == sorted(want), f"sweep jobs {sorted(got)} != {sorted(want)}"
    for overrides, job in want.items():
        try:
            assert_every_file_as_the_reference(got[overrides], job)
        except AssertionError as e:
            raise AssertionError(f"job {' '.join(overrides)}: {e}") from e
        assert not (got[overrides] / "refused.json").exists(), f"{got[overrides]}/refused.json"
    assert summary_tables(sweep_dir) == summary_tables(reference), "sweep summary"
