"""The training objective: a component the loop calls, under its autocast, for each micro-batch."""

import pytest
import torch

from helpers.files import logged
from vit_train.objectives.classify import Classify, CrossEntropy


def test_classify_is_cross_entropy_with_label_smoothing_on_indices_and_probabilities(make_config):
    cfg = make_config(aug={"label_smoothing": 0.1})
    objective = cfg.objective.build_loss(cfg, torch.nn.Identity(), 4)
    logits = torch.tensor([[2.0, 0.0, -1.0, 0.5], [0.0, 1.0, 0.0, 3.0]])
    loss, out = objective(torch.nn.Identity(), logits, torch.tensor([0, 3]))
    smoothed = torch.full((2, 4), 0.1 / 4) + 0.9 * torch.eye(4)[[0, 3]]
    expected = -(smoothed * logits.log_softmax(1)).sum(1).mean()
    assert out is logits and torch.allclose(loss, expected)
    loss_p, _ = objective(torch.nn.Identity(), logits, torch.eye(4)[[0, 3]])  # one-hot probabilities
    assert torch.allclose(loss_p, expected)


class NoTop1(CrossEntropy):
    """The classification loss, but no logits handed back, as an objective without class
    predictions (MAE) does; it also records whether it ran under autocast."""

    autocast = []

    def __call__(self, module, images, targets):
        self.autocast.append(torch.is_autocast_enabled("cpu"))
        loss, _ = super().__call__(module, images, targets)
        return loss, None


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_the_loop_trains_on_the_objectives_loss_and_logs_no_top1_without_logits(tmp_path, make_config, monkeypatch,
                                                                               precision):
    cfg = dict(trainer={"max_steps": 4, "log_every": 1, "accum_steps": 2, "precision": precision})
    plain = tmp_path / "plain"
    from vit_train.train.trainer import train

    train(make_config(**cfg), plain)
    NoTop1.autocast = []
    monkeypatch.setattr(Classify, "build_loss", lambda self, cfg, model, classes, *names: NoTop1())
    train(make_config(**cfg), tmp_path / "no_top1")
    assert NoTop1.autocast == [precision == "bf16"] * 8  # 4 steps of 2 micro-batches, under the loop's autocast
    ours, theirs = logged(tmp_path / "no_top1", "train"), logged(plain, "train")
    assert [e["loss"] for e in ours] == [e["loss"] for e in theirs]  # the same loss, bit for bit
    assert all("top1" in e for e in theirs) and not any("top1" in e for e in ours)
    a = torch.load(plain / "checkpoints" / "last.pt", weights_only=True)["model"]
    b = torch.load(tmp_path / "no_top1" / "checkpoints" / "last.pt", weights_only=True)["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)



class Counting(CrossEntropy):
    """An objective with state that must survive a restart: the micro-batches it has seen."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def __call__(self, module, images, targets):
        self.calls += 1
        return super().__call__(module, images, targets)

    def state_dict(self):
        return {"calls": self.calls}

    def load_state_dict(self, state):
        if state is not None:
            self.calls = state["calls"]


def test_an_objectives_state_is_checkpointed_and_restored_on_resume(tmp_path, make_config, monkeypatch):
    monkeypatch.setattr(Classify, "build_loss", lambda self, cfg, model, classes, *names: Counting())
    sections = dict(trainer={"max_steps": 4, "ckpt_every": 1, "keep_last": 10})
    from vit_train.train.trainer import train

    train(make_config(**sections), tmp_path / "full")
    assert torch.load(tmp_path / "full" / "checkpoints" / "step_00000002.pt", weights_only=True)["objective"] == {
        "calls": 2}
    train(make_config(**sections, resume=str(tmp_path / "full" / "checkpoints" / "step_00000002.pt")),
          tmp_path / "resumed")
    assert torch.load(tmp_path / "resumed" / "checkpoints" / "last.pt", weights_only=True)["objective"] == {"calls": 4}
