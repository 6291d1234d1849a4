"""Scores: which of two is better, and which weights (the model or its EMA) scored best. The one rule
that training (best.pt, `last_eval`), vit-eval/vit-predict/vit-export's `weights=auto` and a
distillation teacher taken from a checkpoint follow: the objective's direction, the model winning a tie.
"""

from __future__ import annotations

import math

from vit_train.objectives import classify, mae

# the metric an objective scores by -> the objective module that says its direction and how it reads
BY_METRIC = {module.METRIC: module for module in (classify, mae)}


def better(metric: str, score: float, than: float | None) -> bool:
    """Whether `score` beats `than` (None: nothing yet) for `metric` ("top1" higher, "loss" lower); a tie does
    not, a non-finite `score` never does, and any finite one beats a NaN."""
    if not math.isfinite(score):
        return False
    if than is None or math.isnan(than):  # a NaN score (a diverged evaluation) is beaten by any finite one
        return True
    return score > than if BY_METRIC[metric].HIGHER_IS_BETTER else score < than


def winner(metric: str, scores: dict[str, float]) -> str:
    """"model" or "ema" of `scores` {"model": ..., "ema"?: ...}: the EMA only when strictly better."""
    return "ema" if "ema" in scores and better(metric, scores["ema"], scores["model"]) else "model"


def shown(metric: str, score: float) -> str:
    """A score as the log reads it: "top-1 80.00%", "val reconstruction loss 0.4000"."""
    module = BY_METRIC[metric]
    return f"{module.BEST_TEXT} {module.score_text(score)}"


def checkpoint_best(ckpt: dict) -> tuple[str, float] | None:
    """(metric, the run's best score) a checkpoint records, None before its first evaluation; reads
    `best_score`/`best_metric` and, from checkpoints written before them, `best_top1`/`best_loss`."""
    if ckpt.get("best_score") is not None and ckpt.get("best_metric") in BY_METRIC:
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
        metric = scores.get("metric") or classify.METRIC  # the first checkpoints with last_eval scored top-1 only
        source = winner(metric, {"model": scores["model"], "ema": scores["ema"]})
        other, step = "model" if source == "ema" else "ema", scores.get("step", ckpt["step"])
        if scores["ema"] == scores["model"]:
            return source, (f"a tie ({shown(metric, scores['model'])} each at the evaluation of step {step}) goes to "
                            f"the model, as in training")
        return source, (f"it scored {shown(metric, scores[source])} against the {other}'s "
                        f"{shown(metric, scores[other])} at the evaluation of step {step}")
    best = checkpoint_best(ckpt)
    if ckpt.get("best_step") == ckpt["step"] and best is not None:
        return ckpt["best_source"], f"it scored the run's best {BY_METRIC[best[0]].BEST_TEXT}, " \
                                    f"{BY_METRIC[best[0]].score_text(best[1])}, at this step"
    return "ema", "no evaluation is recorded for this checkpoint"
