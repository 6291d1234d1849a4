"""What a training objective is (objective=NAME): `Objective`, the contract every objective keeps, and
`Loss`, what the loop calls once per micro-batch. The loop, the evaluation, best.pt, weights=auto,
results.json, the sweep summary, vit-eval, vit-predict, the figures and resume ask the run's objective
(`cfg.objective`, an instance of its class holding its keys) and know nothing else of it.

An objective is one module (classify.py, distill.py, mae.py): a subclass whose fields are its keys
(objective.*) and whose methods and class attributes say

    metric, higher_is_better, best_text      the evaluation's key it is scored by and which way is better
                                              (best.pt, results.json's best, weights=auto: score.py)
    results, summary_columns                 its numbers in results.json ({key: direction}; `results_of`
                                              fills them) and the ones the sweep summary shows
    title                                    what it trains, in words
    reads_labels, predicts                   whether the data must have labels; whether its model predicts
                                              classes (vit-predict, vit-export's class names)
    refused_on_resume                        its keys a resumed run may not change, each with why
    check(cfg), check_run(cfg)               refuse (ConfigError, one line) what it cannot train: at validation,
                                              and before a run starts (files it needs)
    check_resume(saved, path)                refuse what its checkpoint's state says cannot continue (a teacher)
    build_model, pretrained_target           the model it trains; the module model.pretrained loads into
    flops_per_image                          training FLOPs of one image (for TFLOP/s and MFU)
    build_loss                               the `Loss` the loop calls
    evaluate                                 its metrics over a val loader, the score among them
    inference_model                          the model rebuilt from a checkpoint's weights
    eval_text, score_text, data_text         how the log reads an evaluation, a score and the data's labels
    figures                                  its figures of a model on some val images (vit-eval, TensorBoard)
    evaluation, report                       vit-eval's metrics.json numbers and its text

Setting its own `name` registers a subclass as objective=NAME (schema/typed.py `Option`). It must define
`metric`, `build_model`, `build_loss` and `evaluate` (an objective=NAME without one is refused in one line
when chosen); every other name has a default that fits an objective scored by one number of `evaluate`:
results.json holds best_<metric> and final_<metric>, the sweep summary shows both, the closing line says
"best <metric>", vit-eval prints its metrics, a checkpoint is read back into `build_model`'s model, and
no FLOPs are known (no TFLOP/s or MFU logged).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from vit_train.errors import ConfigError
from vit_train.schema.sections import ObjectiveConfig
from vit_train.schema.typed import overridden

if TYPE_CHECKING:
    import torch
    from torch import nn

    from vit_train.schema.config import Config


class Loss:
    """The loss the loop calls: `loss(module, images, targets) -> (loss, logits or None)`, once per micro-batch.

    - The call runs under the loop's `torch.autocast`. `module` is what the loop trains through (the model,
      or DDP / torch.compile around it): call it, not the plain model, for the forward whose gradients count.
      `images`: (B, 3, H, W) normalised floats on the training device. `targets`: (B,) class indices, or
      (B, classes) probabilities after MixUp/CutMix.
    - `loss`: a scalar tensor, the mean over the micro-batch; the loop divides it by trainer.accum_steps,
      backpropagates it, clips, steps and skips non-finite steps. `logits`: (B, classes), from which the loop
      counts the training top-1, or None for a loss without class predictions (the loop then logs none).
    - Anything that is trained belongs in the model itself (so that the optimiser, DDP, the EMA and the
      checkpoints see it); what the loss needs besides (a frozen teacher) is built with it and kept on it.
    - With trainer.compile_scope=step the call is traced into one graph with the rest of the step
      (train/compiled_step.py): no host read (`.item()`, a Python branch on a tensor's value), and state kept
      across calls in tensors updated in place, not in Python numbers or new tensors bound to attributes.
      Random draws from a generator of its own (MAE's masks) are made outside the graph by `draws`, whose
      keyword arguments the call then receives; a loss dynamo cannot trace whole runs in the eager step, said
      in one line.
    The methods below keep what must survive a restart for exact resume; by default there is nothing.
    """

    def __call__(
        self, module: nn.Module, images: torch.Tensor, targets: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        raise NotImplementedError

    def draws(self, images: torch.Tensor) -> dict[str, torch.Tensor]:
        """Random inputs for the call on micro-batch `images` drawn from generators of the loss's own, as keyword
        arguments of `__call__` (MAE: {"noise": (B, patches)}); the loop calls it just before the call, and a
        compiled step outside its graph. By default none: the call draws from torch's default generator, if at all."""
        return {}

    def state_dict(self) -> dict[str, Any] | None:
        """State for exact resume (a mask sampler's counter, a teacher's SHA-256) as plain data, kept in the
        checkpoint under "objective"; None when there is none."""
        return None

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        """Restore `state_dict`'s state before the first step of a resumed run (refusing what does not match)."""

    def terms(self) -> dict[str, float]:
        """Its own train metrics since the last call (distill: its two loss terms), logged with the train rows."""
        return {}

    def window_state(self) -> dict[str, float] | None:
        """The sums behind `terms` since its last call, as plain data (the checkpoint's train_window "terms"), so
        a resumed run logs the uninterrupted run's row; None when it has none."""
        return None

    def load_window(self, saved: dict[str, float]) -> None:
        """Continue the sums `window_state` kept."""


def state_fingerprint(loss: Loss) -> dict[str, Any]:
    """What a loss keeps on itself that a restart would lose unless its `state_dict` returns it: each attribute's
    value (a tensor by its shape, dtype and bytes; a number, string or container by its repr), modules (a frozen
    teacher: weights, not state) and callables left out. Compared over a run by `unsaved_state`."""
    import torch

    found: dict[str, Any] = {}
    for name, value in vars(loss).items():
        if isinstance(value, torch.nn.Module) or callable(value):
            continue
        if isinstance(value, torch.Tensor):
            found[name] = (tuple(value.shape), str(value.dtype), value.detach().cpu().contiguous().numpy().tobytes())
        elif isinstance(value, torch.Generator):
            found[name] = value.get_state().numpy().tobytes()
        else:
            found[name] = repr(value)
    return found


def unsaved_state(loss: Loss, built: dict[str, Any]) -> list[str]:
    """The attributes of `loss` that changed since `built` (its `state_fingerprint` when it was built) although its
    `state_dict` is Loss's, which keeps nothing: a resumed run would start them afresh, and diverge from the
    uninterrupted run without a word. Empty for a loss that defines its own `state_dict` (it says what it keeps)."""
    if type(loss).state_dict is not Loss.state_dict:
        return []
    now = state_fingerprint(loss)
    return sorted(name for name in now.keys() | built.keys() if now.get(name) != built.get(name))


@dataclass
class Objective(ObjectiveConfig):
    """The contract of a training objective (this module's docstring); a subclass is one objective."""

    title: ClassVar[str] = ""  # what it trains, in words: "classification" (default: its name)
    reads_labels: ClassVar[bool] = True
    predicts: ClassVar[bool] = True
    best_text: ClassVar[str] = ""  # how the closing line names the best score, e.g. "top-1" (default: metric)
    pretrained_loads: ClassVar[str] = "the whole model"  # what model.pretrained=<one of its checkpoints> takes
    # results key -> (sweep summary's header, decimals); default: results' best_<metric> and final_<metric>
    summary_columns: ClassVar[dict[str, tuple[str, int]]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if not cls.metric:
            return  # a shared base, or one refused when chosen (`unimplemented`)
        direction = "maximize" if cls.higher_is_better else "minimize"
        cls.results = cls.results or {f"best_{cls.metric}": direction, f"final_{cls.metric}": direction}
        cls.summary_columns = cls.summary_columns or {
            key: (key.replace("_", " "), 4)
            for key in cls.results
            if key in (f"best_{cls.metric}", f"final_{cls.metric}")
        }
        cls.best_text = cls.best_text or cls.metric
        cls.title = cls.title or str(cls.__dict__.get("name") or cls.__name__)

    @classmethod
    def unimplemented(cls) -> list[str]:
        """The names an objective must define that `cls` does not: metric, build_model, build_loss, evaluate."""
        missing = [] if cls.metric else ["metric"]
        return missing + [m for m in ("build_model", "build_loss", "evaluate") if not overridden(cls, Objective, m)]

    def check_run(self, cfg: Config) -> None:
        """Refuse (ConfigError, one line) before a training run starts what the config alone does not show."""

    def build_model(self, cfg: Config, num_classes: int) -> nn.Module:
        raise NotImplementedError

    def pretrained_target(self, model: nn.Module) -> nn.Module:
        """The module `model.pretrained` loads into: the whole model unless the objective says otherwise."""
        return model

    def flops_per_image(self, cfg: Config, num_classes: int) -> float:
        """Training FLOPs (forward and backward) of one image; 0: unknown (no TFLOP/s or MFU is logged)."""
        return 0.0

    def build_loss(
        self, cfg: Config, model: nn.Module, num_classes: int, class_names: list[str] | None = None, rank: int = 0
    ) -> Loss:
        """The loss for `model` (plain, unwrapped, on its device), `num_classes` classes (`class_names`, the data's
        in label order, when known), in process `rank`."""
        raise NotImplementedError

    def evaluate(
        self,
        model: nn.Module,
        loader,
        device: torch.device,
        amp_dtype: torch.dtype | None,
        cfg: Config,
        progress: bool = False,
        confusion: bool = False,
    ) -> dict[str, Any]:
        """Its metrics over the whole loader (every process its share, summed); `metric` among them."""
        raise NotImplementedError

    def inference_model(self, cfg: Config, trained_img_size: int, num_classes: int, weights: dict) -> nn.Module:
        """The model rebuilt from a checkpoint's `weights` (a checkpoint's "model" or "ema"): `build_model`'s, at
        `cfg.model.img_size` (learned positions interpolated from `trained_img_size`: models/pretrained.py
        `at_size`). Raises RuntimeError (load_state_dict's) for weights that do not fit it."""
        from vit_train.models.pretrained import at_size

        model = self.build_model(cfg, num_classes)
        model.load_state_dict(at_size(model, weights))
        return model

    def eval_text(self, metrics: dict[str, float], ema: dict[str, float] | None, classes: int | None = None) -> str:
        """An evaluation in the log line: each number of `metrics` (and of the EMA's)."""
        text = "val " + ", ".join(f"{k} {v:.4f}" for k, v in metrics.items() if isinstance(v, (int, float)))
        return text + (f", EMA {self.metric} {ema[self.metric]:.4f}" if ema is not None and self.metric in ema else "")

    @classmethod
    def score_text(cls, score: float) -> str:
        return f"{score:.4f}"

    def data_text(self, num_classes: int) -> str:
        """What the run's start line says of the data's labels."""
        return f"{num_classes} classes"

    def results_of(self, best: float | None, metrics: dict[str, Any]) -> dict[str, Any]:
        """Its `results` keys for results.json: `best` (its best score, None before the first evaluation) and the
        last evaluation's `metrics` (empty before one). Default: best_<metric> is `best`, final_<key> the last
        evaluation's <key> (None for a key it does not hold)."""
        return {
            key: best
            if key == f"best_{self.metric}"
            else metrics.get(key.removeprefix("final_"))
            if key.startswith("final_")
            else None
            for key in self.results
        }

    def figures(
        self,
        model: nn.Module,
        images: torch.Tensor,
        labels: torch.Tensor,
        class_names: list[str],
        stats: tuple,
        confusion: torch.Tensor | None = None,
    ) -> dict[str, Any]:
        """{name: matplotlib figure} of `model` on normalised val `images` (vit-eval's PNGs, TensorBoard's)."""
        return {}

    def evaluation(self, metrics: dict[str, Any], class_names: list[str]) -> dict[str, Any]:
        """vit-eval's numbers for metrics.json from `evaluate`'s `metrics` (with its confusion matrix)."""
        return dict(metrics)

    @classmethod
    def report(cls, results: dict[str, Any], what: str) -> str:
        """vit-eval's text of the numbers `evaluation` gave, starting with `what` was evaluated (`results` also
        holds vit-eval's record of what it evaluated: tools/report.py). Default: its score, then every other number
        `evaluation` gave, one a line."""
        record = ("step", "img_size", "trained_img_size")  # numbers of that record, not of the evaluation
        keys = [
            cls.metric,
            *(
                k
                for k, v in results.items()
                if k != cls.metric and k not in record and isinstance(v, (int, float)) and not isinstance(v, bool)
            ),
        ]
        return "\n".join([what, *(f"{key} {results[key]:.4f}" for key in keys if key in results)])

    def check_resume(self, saved: dict[str, Any] | None, path: Any) -> None:
        """Refuse (CheckpointError, one line), before the resumed run is built, what its checkpoint's objective
        state (`saved`: its loss's `state_dict`; `path` the checkpoint) says cannot continue with this config."""

    def restart_hint(self, path: Any) -> str:
        """What to do instead of resuming checkpoint `path` with its own keys changed: a new run from its weights."""
        return (
            f"or start a new objective={self.name} run from its weights: vit-train objective={self.name} "
            f"model.pretrained={path} <your overrides> (model.pretrained loads {self.pretrained_loads})"
        )

    def refuse_prediction(self, what: str) -> None:
        """ConfigError (one line) when its model predicts no classes; `what` says what was asked of it."""
        if not self.predicts:
            raise ConfigError(
                f"this is a {self.title} checkpoint (objective={self.name}); it {what}. Fine-tune it first: "
                f"vit-train model.pretrained=<its run directory> (docs/finetuning.md)"
            )
