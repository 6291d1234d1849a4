"""optim=adamw, the default: decoupled weight decay Adam (Loshchilov and Hutter 2019), torch's AdamW.

Fused on CUDA (one kernel for the whole update; it skips a non-finite step by itself: train/step.py); for a compiled
step (trainer.compile_scope=step) its multi-tensor `capturable` form, whose step counts live on the device and whose
learning rate is a device tensor, updated by torch's functional `adam` inside the graph. Importing it imports no torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from vit_train.schema.sections import OptimConfig
from vit_train.schema.typed import require

if TYPE_CHECKING:
    from vit_train.schema.sections import RunConfig


@dataclass
class AdamW(OptimConfig):
    default = True
    moments = 2  # exp_avg, exp_avg_sq

    name: str = "adamw"
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])  # the moments' decay rates
    eps: float = 1e-8  # added to the second moment's square root

    def check(self, cfg: RunConfig) -> None:
        super().check(cfg)
        require(len(self.betas) == 2, f"optim.betas must have two values, got {self.betas}")

    def build(self, groups: list[dict], lr: float, device: Any, capturable: bool = False) -> Any:
        import torch

        betas = (self.betas[0], self.betas[1])  # two values (check)
        if capturable:
            return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=self.eps, foreach=True, capturable=True)
        return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=self.eps, fused=device.type == "cuda")

    def update(self, params: list, grads: list, state: list[dict], group: dict, lr: Any) -> None:
        from torch.optim.adam import adam  # what AdamW.step calls; a module-level name dynamo can trace

        adam(
            params,
            grads,
            [s["exp_avg"] for s in state],
            [s["exp_avg_sq"] for s in state],
            [],
            [s["step"] for s in state],
            foreach=True,
            capturable=True,
            decoupled_weight_decay=True,
            amsgrad=False,
            beta1=group["betas"][0],
            beta2=group["betas"][1],
            lr=lr,
            weight_decay=group["weight_decay"],
            eps=group["eps"],
            maximize=False,
        )

    def init_state(self, optimizer: Any) -> None:
        """Step counts (device tensors: capturable) and moments at zero, as its first step makes them."""
        import torch

        for group in optimizer.param_groups:
            for p in group["params"]:
                if not optimizer.state[p]:
                    optimizer.state[p].update(
                        step=torch.zeros((), dtype=torch.float32, device=p.device),
                        exp_avg=torch.zeros_like(p, memory_format=torch.preserve_format),
                        exp_avg_sq=torch.zeros_like(p, memory_format=torch.preserve_format),
                    )
