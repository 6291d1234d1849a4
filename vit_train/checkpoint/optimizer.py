"""A checkpoint's optimiser state into this run's optimiser, sharded (FSDP) or not, by one rule: what torch's own
`Optimizer.load_state_dict` accepts for an unsharded model, after checking that every saved per-parameter state
is one this optimiser could have written for that parameter (a damaged or foreign file is one line, before any
step, never a traceback mid-step or a silent fresh start under one strategy only).
"""

from __future__ import annotations

import inspect
import math

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict
from torch.distributed.fsdp import FSDPModule


def load_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer, saved: dict) -> None:
    """`saved`, an optimiser state dict in torch's layout (as any run saves it), into `optimizer`, sharded or not,
    alike: a parameter without saved state (one that never had a gradient) starts with fresh moments, as torch's
    load_state_dict leaves it. Raises ValueError naming the first thing that does not fit (`check_fits`)
    before anything is loaded."""
    check_fits(model, optimizer, saved)
    if not isinstance(model, FSDPModule):
        optimizer.load_state_dict(saved)
        return
    names = param_names(model, optimizer)
    # keys the scheduler added to the saved groups (initial_lr) are not this optimiser's yet: set them after,
    # as torch's load_state_dict would have (pytorch #126948, #140900)
    extra = [
        {k: v for k, v in g.items() if k not in now}
        for g, now in zip(saved["param_groups"], optimizer.param_groups, strict=True)
    ]
    keyed = {
        "state": {names[i]: s for i, s in saved["state"].items()},
        "param_groups": [
            {k: v for k, v in g.items() if k not in more} | {"params": [names[i] for i in g["params"]]}
            for g, more in zip(saved["param_groups"], extra, strict=True)
        ],
    }
    set_optimizer_state_dict(model, optimizer, keyed, options=StateDictOptions(full_state_dict=True, strict=False))
    for group, more in zip(optimizer.param_groups, extra, strict=True):
        group.update(more)
    params = [p for group in optimizer.param_groups for p in group["params"]]
    for index, param in enumerate(params):  # set_optimizer_state_dict made state for all by a step of zeros:
        if index not in saved["state"]:  # without saved state a parameter starts fresh, as in one process
            optimizer.state.pop(param, None)


def check_fits(model: nn.Module, optimizer: torch.optim.Optimizer, saved: dict) -> None:
    """ValueError unless `saved` is a state this optimiser could have written for this model: its groups number
    each parameter once; each per-parameter state holds the keys one step of this optimiser makes (AdamW: step,
    exp_avg, exp_avg_sq; SGD with momentum: momentum_buffer), the step a finite count, every other entry a
    floating tensor of the parameter's shape (a DTensor's whole shape)."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    names = param_names(model, optimizer)
    indices = [i for group in saved["param_groups"] for i in group["params"]]
    if len(indices) != len(params):
        raise ValueError(f"the saved optimiser has {len(indices)} parameters, this model {len(params)}")
    if not all(type(i) is int for i in indices) or sorted(indices) != list(range(len(params))):
        odd = next(i for i in indices if type(i) is not int or not 0 <= i < len(params) or indices.count(i) > 1)
        raise ValueError(
            f"the saved optimiser's parameter groups name parameter {odd!r} "
            f"{'twice' if indices.count(odd) > 1 else 'which this model lacks'}"
        )
    keys, kind = state_keys(optimizer), type(optimizer).__name__
    for index, state in saved["state"].items():
        if not isinstance(index, int) or not 0 <= index < len(params):
            raise ValueError(
                f"the saved optimiser has state for parameter {index!r}, this model's are 0-{len(params) - 1}"
            )
        name, shape = names[index], tuple(params[index].shape)
        if not isinstance(state, dict) or set(state) != keys:
            held = sorted(state) if isinstance(state, dict) else type(state).__name__
            raise ValueError(f"the saved optimiser's state of {name} holds {held}; {kind} keeps {sorted(keys)}")
        for key, value in state.items():
            if key == "step":
                count = value.item() if torch.is_tensor(value) and value.ndim == 0 else value
                if type(count) not in (int, float) or not math.isfinite(count) or count < 0:
                    raise ValueError(f"the saved optimiser's step of {name} is {_shown(value)}, not a count of steps")
            elif not torch.is_tensor(value) or not value.is_floating_point() or tuple(value.shape) != shape:
                said = (
                    f"has shape {tuple(value.shape)}"
                    if torch.is_tensor(value) and tuple(value.shape) != shape
                    else f"is {_shown(value)}"
                )
                raise ValueError(f"the saved optimiser's {key} of {name} {said}, the parameter {shape}")


def state_keys(optimizer: torch.optim.Optimizer) -> set[str]:
    """The per-parameter state keys `optimizer` keeps: those one step of a copy of it (the same class and
    hyperparameters) makes for a 1-element parameter, so any torch optimiser is judged by its own rule."""
    accepted = set(inspect.signature(type(optimizer).__init__).parameters)
    settings = {
        k: v for k, v in optimizer.defaults.items() if k in accepted and k not in ("fused", "foreach", "capturable")
    }
    probe = torch.zeros(1, requires_grad=True)
    probe.grad = torch.zeros(1)
    copy = type(optimizer)([probe], **settings, foreach=False)
    copy.step()
    return set(copy.state[probe])


def param_names(model: nn.Module, optimizer: torch.optim.Optimizer) -> list[str]:
    """The parameters' names in the order torch's optimizer state_dict numbers them."""
    name_of = {id(p): n for n, p in model.named_parameters()}
    return [name_of[id(p)] for group in optimizer.param_groups for p in group["params"]]


def _shown(value) -> str:
    """A saved value as an error message names it: a tensor by shape and dtype, anything else by its type."""
    if torch.is_tensor(value):
        return f"{value.item()!r}" if value.ndim == 0 else f"a {value.dtype} tensor of shape {tuple(value.shape)}"
    return repr(value) if isinstance(value, (int, float)) else f"a {type(value).__name__}"
