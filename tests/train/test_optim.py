import math

import pytest
import torch

from vit_train.optim.adamw import AdamW
from vit_train.optim.sgd import SGD
from vit_train.schedules.constant import Constant
from vit_train.schedules.cosine import Cosine
from vit_train.schema.sections import ScheduleConfig
from vit_train.models.vit import VisionTransformer
from vit_train.train.optim import build_optimizer, build_scheduler, param_groups


def test_no_weight_decay_on_norms_biases_pos_embed_and_cls_token():
    model = VisionTransformer(img_size=16, patch_size=4, num_classes=3, embed_dim=16, depth=2, num_heads=2)
    decay, no_decay = param_groups(model, 0.1)
    names = {id(p): n for n, p in model.named_parameters()}
    no_decay_names = {names[id(p)] for p in no_decay["params"]}
    expected = {n for n, p in model.named_parameters()
                if n.endswith(".bias") or "norm" in n or n in ("pos_embed", "cls_token")}
    assert no_decay_names == expected and no_decay["weight_decay"] == 0.0
    assert {names[id(p)] for p in decay["params"]} == set(names.values()) - expected
    assert decay["weight_decay"] == 0.1 and "patch_embed.proj.weight" not in expected


def lrs(schedule: ScheduleConfig, steps_per_epoch: int, total: int, start: int = 0, lr: float = 1.0) -> list[float]:
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)
    scheduler = build_scheduler(optimizer, AdamW(lr=lr), schedule, steps_per_epoch, total, start)
    seen = []
    for _ in range(start, total):
        seen.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return seen


def test_linear_warmup_then_cosine_to_min_lr_at_the_last_step():
    seen = lrs(Cosine(warmup_epochs=0.5, min_lr=0.1), steps_per_epoch=8, total=20)
    assert seen[:4] == pytest.approx([0.25, 0.5, 0.75, 1.0])  # 4 warmup steps, peak on the 4th
    assert seen[-1] == pytest.approx(0.1)  # min_lr exactly at the end
    decay = seen[3:]
    assert all(a > b for a, b in zip(decay, decay[1:]))
    middle = 3 + (len(decay) - 1) / 2  # the cosine's midpoint
    assert seen[int(middle)] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (int(middle) - 3) / 16)))


def test_schedule_ends_at_the_max_steps_cap():
    seen = lrs(Cosine(warmup_epochs=0, min_lr=0.0), steps_per_epoch=100, total=10)
    assert seen[0] == 1.0 and seen[-1] == pytest.approx(0.0)


def test_constant_schedule_after_warmup():
    seen = lrs(Constant(warmup_epochs=0.25), steps_per_epoch=8, total=12)
    assert seen == pytest.approx([0.5, 1.0] + [1.0] * 10)


def test_rebuilt_schedule_continues_the_same_curve():
    schedule = Cosine(warmup_epochs=1, min_lr=0.01)
    full = lrs(schedule, 10, 50, lr=3e-3)
    assert lrs(schedule, 10, 50, start=23, lr=3e-3) == full[23:]  # bit-identical


def test_fused_adamw_only_on_cuda():
    model = torch.nn.Linear(2, 2)
    optimizer = build_optimizer(model, AdamW(), torch.device("cpu"))
    assert isinstance(optimizer, torch.optim.AdamW) and not optimizer.defaults["fused"]
    assert isinstance(build_optimizer(model, SGD(), torch.device("cpu")), torch.optim.SGD)
