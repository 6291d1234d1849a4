"""trainer.limit_val_batches (Lightning's name): an evaluation over the first N val batches only, as
trainer=debug sets it, so a 5-step check does not spend half a minute on 2,000 val images. A partial
validation says so everywhere its top-1 shows (log line, metrics.jsonl, results.json), and a limit at
or above the val set's batches is the whole set (anemoi-core #864: a limit past the data misled)."""

from __future__ import annotations

import json

import pytest
import torch

from helpers.configs import composed, tiny_config
from vit_train.config import Config
from vit_train.data.first_batches import FirstBatches
from vit_train.errors import ConfigError
from vit_train.train.trainer import train

# tiny_config: 128 val images in batches of 32, so 4 val batches


def batches(sizes):
    return [(torch.zeros(n, 3, 2, 2), torch.arange(n)) for n in sizes]


@pytest.mark.parametrize("limit, kept, partial", [(None, 3, False), (1, 1, True), (2, 2, True), (3, 3, False),
                                                  (10, 3, False)])
def test_first_batches_yields_the_first_and_counts_their_images(limit, kept, partial):
    loader = batches([4, 4, 3])
    first = FirstBatches(loader, limit)
    got = list(first)
    assert got == loader[:kept] and len(first) == kept and first.partial is partial and first.total == 3
    assert first.images == [4, 8, 11][kept - 1]
    list(first)
    assert first.images == [4, 8, 11][kept - 1]  # counted again per pass, not summed over passes


def test_debug_trainer_limits_validation_and_the_key_is_checked():
    assert composed(["trainer=debug"])["trainer"]["limit_val_batches"] == 2
    assert composed([])["trainer"]["limit_val_batches"] is None
    with pytest.raises(ConfigError, match=r"^trainer.limit_val_batches must be > 0, got 0$"):
        Config.from_dict({"trainer": {"limit_val_batches": 0}})


def read_run(run_dir):
    results = json.loads((run_dir / "results.json").read_text())
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return results, [r for r in rows if r["split"] in ("val", "val_ema")]


def test_a_partial_validation_is_marked_and_a_limit_past_the_set_is_the_whole_set(tmp_path, caplog):
    steps = {"max_steps": 2, "ema_decay": 0.5}
    with caplog.at_level("INFO", logger="vit_train"):
        train(tiny_config(trainer={**steps, "limit_val_batches": 1}), tmp_path / "one")
    messages = [r.getMessage() for r in caplog.records]
    train(tiny_config(trainer={**steps, "limit_val_batches": 4}), tmp_path / "four")
    train(tiny_config(trainer=steps), tmp_path / "all")
    one, one_rows = read_run(tmp_path / "one")
    assert one["val_partial"] is True and one["val_images"] == 32
    assert [(r["split"], r["val_images"]) for r in one_rows] == [("val", 32), ("val_ema", 32)]
    assert round(one["final_top1"] * 32 / 100, 6) == int(round(one["final_top1"] * 32 / 100))  # hits of 32 images
    said = [m for m in messages if m.startswith("step 2 ")]
    assert len(said) == 1 and said[0].endswith("; a partial validation: 32 images, the first 1 of 4 val batches "
                                               "(trainer.limit_val_batches=1)")
    assert any(m.startswith("completed: best top-1 ") and " on a partial validation (32 images, "
               "trainer.limit_val_batches)" in m for m in messages)
    whole, whole_rows = read_run(tmp_path / "four")
    unlimited, unlimited_rows = read_run(tmp_path / "all")
    assert whole["val_partial"] is False and whole["val_images"] is None and unlimited["val_partial"] is False
    assert whole["final_top1"] == unlimited["final_top1"] and whole_rows == unlimited_rows
    assert all("val_images" not in r for r in whole_rows)
    assert one["final_top1"] != unlimited["final_top1"] or one["final_loss"] != unlimited["final_loss"]


@pytest.mark.parametrize("evals, best", [
    # (partial?, top-1) in order -> (best score, its step, partial?)
    ([(True, 14.8), (False, 13.5)], (13.5, 2, False)),   # a full validation replaces a partial best, even lower
    ([(False, 13.5), (True, 90.0)], (13.5, 1, False)),   # a partial one never replaces a full best
    ([(True, 10.0), (True, 12.0)], (12.0, 2, True)),     # partial against partial: the better
    ([(False, 10.0), (False, 12.0), (True, 99.0)], (12.0, 2, False)),
    ([(True, 10.0), (False, float("nan")), (False, 5.0)], (5.0, 3, False)),  # a NaN full score wins nothing
])
def test_a_partial_validations_score_never_competes_with_a_full_ones(evals, best):
    """trainer=debug then resumed with a full validation: the partial 14.84% stayed best.pt and best_top1
    against a full 14.25%. Partial scores compete only with partial ones."""
    from vit_train.checkpoint import TrainState

    state = TrainState()
    for step, (partial, top1) in enumerate(evals, start=1):
        state.step = step
        state.record_eval("top1", {"model": top1}, partial=partial)
    assert (state.best_score, state.best_step, state.best_partial) == best
    assert state.last_eval.get("partial", False) == evals[-1][0]


def test_results_and_the_export_identity_say_a_best_score_is_partial(tmp_path):
    import json

    import torch

    from vit_train.checkpoint import eval_score

    train(tiny_config(trainer={"max_steps": 2, "limit_val_batches": 1}), tmp_path / "run")
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["best_partial"] is True and results["val_partial"] is True
    ckpt = torch.load(tmp_path / "run" / "checkpoints" / "last.pt", weights_only=True)
    assert ckpt["best_partial"] is True and eval_score(ckpt, "model")["partial"] is True
