"""A user's loss that keeps state on itself without returning it from `state_dict` would resume afresh and train
otherwise than the uninterrupted run, without a word: the run says so once, at its first checkpoint, naming the
attributes (objectives/base.py `unsaved_state`). A loss whose state_dict keeps them, and a stateless one, say
nothing."""

from __future__ import annotations

import logging

import pytest
import torch

from vit_train.objectives import classify
from vit_train.objectives.base import state_fingerprint, unsaved_state
from vit_train.train.trainer import train


class Counting(classify.CrossEntropy):
    """Counts its calls and keeps a running mean of the loss on itself: state a restart must carry."""

    def __call__(self, module, images, targets):
        loss, logits = super().__call__(module, images, targets)
        self.calls = getattr(self, "calls", 0) + 1
        self.mean = getattr(self, "mean", torch.zeros(())) * 0.9 + 0.1 * loss.detach()
        return loss, logits


class Saving(Counting):
    def state_dict(self):
        return {"calls": getattr(self, "calls", 0)}

    def load_state_dict(self, state):
        if state:
            self.calls = state["calls"]


@pytest.mark.parametrize("loss, said", [(Counting, "calls, mean"), (Saving, None), (classify.CrossEntropy, None)],
                         ids=["state-not-saved", "state-saved", "stateless"])
def test_a_loss_with_state_its_state_dict_does_not_keep_is_said_once(tmp_path, make_config, monkeypatch, caplog,
                                                                      loss, said):
    monkeypatch.setattr(classify, "CrossEntropy", loss)
    with caplog.at_level(logging.WARNING, logger="vit_train"):
        train(make_config(trainer={"max_steps": 4, "ckpt_every": 1}), tmp_path)
    lines = [r.getMessage() for r in caplog.records if "state_dict() keeps nothing" in r.getMessage()]
    if said is None:
        assert lines == []
    else:
        assert lines == [f"objective=classify's loss changed {said} since it was built, but its state_dict() keeps "
                         f"nothing: a resumed run would start them afresh and train otherwise than this one; return "
                         f"them from state_dict() and restore them in load_state_dict() (docs/extending.md, \"State "
                         f"across a restart\")"]


def test_the_fingerprint_reads_tensors_numbers_and_generators_but_not_modules():
    loss = classify.CrossEntropy.__new__(classify.CrossEntropy)
    loss.teacher, loss.count, loss.sums, loss.rng = torch.nn.Linear(2, 2), 0, torch.zeros(3), torch.Generator()
    built = state_fingerprint(loss)
    loss.teacher.weight.data += 1  # a module's weights: not the loss's state
    assert unsaved_state(loss, built) == []
    loss.sums += 1  # in place
    loss.rng.manual_seed(5)
    loss.count = 1
    assert unsaved_state(loss, built) == ["count", "rng", "sums"]
