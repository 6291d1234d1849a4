"""Scores: which of two is better, and which weights (the model or its EMA) scored best. The one rule
that training (best.pt, `last_eval`), vit-eval/vit-predict/vit-export's `weights=auto` and a
distillation teacher taken from a checkpoint follow: the objective's direction (the registered objective
scored by the metric: schema/typed.py `options`), the model winning a tie.
"""

from __future__ import annotations

import math

from vit_train.schema.typed import options


def scored_by(metric: str) -> type:
    """The objective class scored by `metric` ("top1", "loss"): it says the direction and how a score reads."""
    found = [cls for cls in options("objective").values() if cls.metric == metric]
    if not found:
        raise KeyError(f"no objective is scored by {metric!r}")
    return found[0]


def better(metric: str, score: float, than: float | None) -> bool:
    """Whether `score` beats `than` (None: nothing yet) for `metric` ("top1" higher, "loss" lower); a tie does
    not, a non-finite `score` never does, and any finite one beats a NaN."""
    if not math.isfinite(score):
        return False
    if than is None or math.isnan(than):  # a NaN score (a diverged evaluation) is beaten by any finite one
        return True
    return score > than if scored_by(metric).higher_is_better else score < than


def winner(metric: str, scores: dict[str, float]) -> str:
    """ "model" or "ema" of `scores` {"model": ..., "ema"?: ...}: the EMA only when strictly better."""
    return "ema" if "ema" in scores and better(metric, scores["ema"], scores["model"]) else "model"


def shown(metric: str, score: float) -> str:
    """A score as the log reads it: "top-1 80.00%", "val reconstruction loss 0.4000"."""
    cls = scored_by(metric)
    return f"{cls.best_text} {cls.score_text(score)}"


def checkpoint_best(ckpt: dict) -> tuple[str, float] | None:
    """(metric, the run's best score) a checkpoint records, None before its first evaluation; reads
    `best_score`/`best_metric` and, from checkpoints written before them, `best_top1`/`best_loss`."""
    if ckpt.get("best_score") is not None and any(
        c.metric == ckpt.get("best_metric") for c in options("objective").values()
    ):
        return ckpt["best_metric"], float(ckpt["best_score"])
    if ckpt.get("best_top1") is not None and ckpt["best_top1"] >= 0:
        return "top1", float(ckpt["best_top1"])
    if ckpt.get("best_loss") is not None and math.isfinite(ckpt["best_loss"]):
        return "loss", float(ckpt["best_loss"])
    return None


def best_weights(ckpt: dict) -> tuple[str, str]:
    """("model" or "ema", why) for a checkpoint's weights=auto: the weights that scored best for it.

    Its last evaluation's scores when it records them (`last_eval`, at this step or before: val top-1,
    higher is better, or for objective mae the val reconstruction loss, lower is better), else
    `best_source` when the checkpoint was written at the run's best step; the model wins a tie, as in
    training. A checkpoint without EMA weights has only the model's.
    """
    if not ckpt.get("ema"):
        return "model", "the run kept no EMA"
    scores = ckpt.get("last_eval") or {}
    if "model" in scores and "ema" in scores:
        metric = scores.get("metric") or "top1"  # the first checkpoints with last_eval scored top-1 only
        source = winner(metric, {"model": scores["model"], "ema": scores["ema"]})
        other, step = "model" if source == "ema" else "ema", scores.get("step", ckpt["step"])
        if scores["ema"] == scores["model"]:
            return source, (
                f"a tie ({shown(metric, scores['model'])} each at the evaluation of step {step}) goes to "
                f"the model, as in training"
            )
        return source, (
            f"it scored {shown(metric, scores[source])} against the {other}'s "
            f"{shown(metric, scores[other])} at the evaluation of step {step}"
        )
    best = checkpoint_best(ckpt)
    if ckpt.get("best_step") == ckpt["step"] and best is not None:
        cls = scored_by(best[0])
        return ckpt["best_source"], f"it scored the run's best {cls.best_text}, {cls.score_text(best[1])}, at this step"
    return "ema", "no evaluation is recorded for this checkpoint"
