"""What a run wrote, read back: metrics.jsonl rows, results.json, TensorBoard scalars, checkpoint
weights, every file's bytes; and `assert_same_run`, a resumed run against an uninterrupted one."""

from __future__ import annotations

import json
from pathlib import Path


def rows(run_dir: Path) -> list[dict]:
    """All rows of a run's metrics.jsonl, in order."""
    return [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]


def logged(run_dir: Path, split: str) -> list[dict]:
    """The rows of a run's metrics.jsonl for `split` (train, val, val_ema), in order."""
    return [e for e in rows(run_dir) if e["split"] == split]


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


def assert_same_run(run_dir, reference):
    """Every (split, step) row once, with the reference's values (an uninterrupted run with the same seed);
    the same TensorBoard scalars, final weights and optimiser state; no temporary files; completed."""
    import torch

    got, want = rows(run_dir), rows(reference)
    keys = [(r["split"], r["step"]) for r in got]
    assert len(keys) == len(set(keys)), f"rows logged twice: {sorted(k for k in keys if keys.count(k) > 1)}"
    drop = ("images_per_s", "data_wait", "tflops", "mfu")  # timing
    strip = lambda r: {k: v for k, v in r.items() if k not in drop}  # noqa: E731
    assert sorted(map(strip, got), key=lambda r: (r["step"], r["split"])) == \
        sorted(map(strip, want), key=lambda r: (r["step"], r["split"]))
    for tag in ("train/loss", "val/top1"):
        assert tb_scalars(run_dir, tag) == tb_scalars(reference, tag), tag
    a = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    b = torch.load(reference / "checkpoints" / "last.pt", weights_only=True)
    for part in ("model", "optimizer"):
        flat_a, flat_b = (torch.utils._pytree.tree_flatten(x[part])[0] for x in (a, b))
        assert all(torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y for x, y in zip(flat_a, flat_b)), part
    assert not list(run_dir.rglob("*.tmp")), list(run_dir.rglob("*.tmp"))
    assert json.loads((run_dir / "results.json").read_text())["status"] == "completed"
