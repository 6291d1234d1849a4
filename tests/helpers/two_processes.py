"""Several processes against one (torchrun with gloo on the CPU): the runs' overrides and the oracle.

Used by test_distributed.py, test_fsdp.py and test_fsdp_faults.py: two processes train like one within
1e-5 relative per-step loss and rtol 1e-4 / atol 1e-5 on every weight but one kind (`assert_weights_close`).

The exception: the key third of an attention block's qkv bias. Softmax is invariant to it (it adds q.b_k to
every logit of a query's row), so its true gradient is zero and what the backward computes is rounding noise
(~1e-10, where the query and value biases' gradients are ~1e-4 to 1e-3); AdamW divides that noise by
sqrt(v_hat) + eps, with sqrt(v_hat) below eps, so each step moves the bias by about lr x noise / eps: the bias is
noise of its own, and two runs that round differently (one process, or two summing their halves) end with
different noise (measured on the CPU: up to 1.2e-4 for vit_micro after 40 steps, docs/multi-gpu.md). It changes
no output. Such a tensor is held to a bound derived from the two checkpoints' AdamW state instead (`noise_bound`),
and only when its gradient was noise in both runs (`NOISE`): a key bias that trains (model.qk_norm normalises
the keys, so its bias does get a gradient) is held to the tolerance as every other weight.
"""

from __future__ import annotations

from pathlib import Path

import torch

TINY = ["model.embed_dim=32", "model.depth=2", "model.num_heads=2", "model.img_size=16", "data.train_size=256",
        "data.val_size=101", "data.batch_size=32", "trainer.device=cpu", "trainer.progress=false",
        "trainer.log_every=1", "trainer.accum_steps=2"]  # 8 steps per epoch; 101 val images do not split evenly

RTOL, ATOL = 1e-4, 1e-5
NOISE = 1e-5  # a key bias's gradient is noise when sqrt(v) of its every entry is below NOISE x the value bias's largest
QKV_BIAS = "attn.qkv.bias"


def checkpoint(run: Path | dict, name: str = "last.pt") -> dict:
    """A run directory's checkpoints/<name>, or a checkpoint already loaded."""
    if isinstance(run, dict):
        return run
    return torch.load(Path(run) / "checkpoints" / name, weights_only=True)


def optimizer_names(ckpt: dict) -> dict[int, str]:
    """The parameter names in the order torch numbers them in the checkpoint's optimiser state: the run's own
    model and parameter groups (vit_train/train/optim.py), rebuilt from the checkpoint's config."""
    from vit_train.config import Config
    from vit_train.train.optim import param_groups

    cfg = Config.from_saved({**ckpt["config"], "resume": None})
    model = cfg.objective.build_model(cfg, len(ckpt["class_names"]))
    names = {id(p): n for n, p in model.named_parameters()}
    groups = param_groups(model, cfg.optim.weight_decay, cfg.optim.layer_decay, cfg.model)
    order = [names[id(p)] for g in groups for p in g["params"]]
    saved = [i for g in ckpt["optimizer"]["param_groups"] for i in g["params"]]
    assert len(order) == len(saved), f"the optimiser holds {len(saved)} parameters, the rebuilt model {len(order)}"
    return dict(zip(saved, order))


def key_moments(ckpt: dict) -> dict[str, tuple[torch.Tensor, torch.Tensor, int, float, float, float]]:
    """For each qkv bias the optimiser trained: (v of its key third, v of its value third, AdamW's step count,
    the largest lr its group can have, beta2, eps)."""
    names = optimizer_names(ckpt)
    groups = {i: g for g in ckpt["optimizer"]["param_groups"] for i in g["params"]}
    found = {}
    for i, state in ckpt["optimizer"]["state"].items():
        if not names[i].endswith(QKV_BIAS) or "exp_avg_sq" not in state:
            continue
        g = groups[i]
        assert state["exp_avg_sq"].shape == ckpt["model"][names[i]].shape, names[i]
        _, v_key, v_value = state["exp_avg_sq"].float().chunk(3)
        lr = max(g.get("initial_lr", g["lr"]), g["lr"])  # warmup rises to initial_lr, the cosine falls from it
        found[names[i]] = (v_key, v_value, int(state["step"]), lr, g["betas"][1], g["eps"])
    return found


def noise_bound(a: dict, b: dict) -> dict[str, torch.Tensor]:
    """Per entry, a bound on |a - b| for the key third of each qkv bias whose gradient was noise in both runs
    (both started from the same weights; checkpoints `a` and `b` with their optimiser state).

    Derived from AdamW's update, step t: lr_t * m_hat_t / (sqrt(v_hat_t) + eps), so |step| <= lr_max * G / eps,
    where G bounds every |g_t| (m_hat is an average of the gradients with weights summing to 1). The saved
    v_T = (1 - beta2) * sum_t beta2^(T-t) g_t^2 >= (1 - beta2) * beta2^(T-1) * g_t^2 gives
    G = sqrt(v_T / ((1 - beta2) * beta2^(T-1))). Weight decay only shrinks a weight (and biases have none), an
    EMA averages values so bounded, so after T steps each run is within T * lr_max * G / eps of the common start,
    and the two within the sum of the two."""
    bounds = {}
    ma, mb = key_moments(a), key_moments(b)
    for name in ma.keys() & mb.keys():
        (ka, va, t, lr, beta2, eps), (kb, vb, tb, lrb, _, _) = ma[name], mb[name]
        if not (ka.sqrt().max() <= NOISE * va.sqrt().max() and kb.sqrt().max() <= NOISE * vb.sqrt().max()):
            continue  # a key bias that trains (qk_norm): no exception
        steps, lr_max = max(t, tb), max(lr, lrb)
        floor = (1 - beta2) * beta2 ** (steps - 1)
        bounds[name] = steps * lr_max / eps * ((ka / floor).sqrt() + (kb / floor).sqrt())
    return bounds


def allowance(bound: torch.Tensor, expected: torch.Tensor) -> torch.Tensor:
    """What a key third's entry may differ by: its noise bound, or the tolerance where that is larger."""
    return torch.maximum(bound, ATOL + RTOL * expected.abs())


def assert_weights_close(a: Path | dict, b: Path | dict, part: str = "model"):
    """Two runs' weights (`part`: "model" or "ema") from their run directories' last.pt, or checkpoints: every
    tensor within rtol 1e-4 / atol 1e-5, but the key thirds of the qkv biases whose gradient was noise in both
    runs, which are within `noise_bound` or the tolerance, the larger (see the module's docstring)."""
    a, b = checkpoint(a), checkpoint(b)
    bounds = noise_bound(a, b)
    wa, wb = a[part], b[part]
    assert wa.keys() == wb.keys()
    for key in wa:
        x, y = wa[key], wb[key]
        name = key.removeprefix("module.")  # an EMA's AveragedModel keys
        if name not in bounds:
            torch.testing.assert_close(x, y, rtol=RTOL, atol=ATOL, msg=key)
            continue
        (qa, ka, va), (qb, kb, vb) = x.chunk(3), y.chunk(3)
        torch.testing.assert_close(torch.cat([qa, va]), torch.cat([qb, vb]), rtol=RTOL, atol=ATOL, msg=key)
        over = (ka - kb).abs() > allowance(bounds[name], kb)
        assert not over.any(), (f"{key}: key third differs by {(ka - kb).abs().max():.3g}, beyond its AdamW noise "
                                f"bound at {over.nonzero().flatten().tolist()}")
