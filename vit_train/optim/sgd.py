"""optim=sgd: SGD with Nesterov momentum (torch's SGD), e.g. for a ResNet teacher (configs/optim/sgd.yaml: lr 0.1,
weight decay 5e-4). Its weight decay is L2 on the gradient, as torch's SGD applies it. Importing it imports no torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from vit_train.schema.sections import OptimConfig
from vit_train.schema.typed import require

if TYPE_CHECKING:
    from vit_train.schema.sections import RunConfig


@dataclass
class SGD(OptimConfig):
    moments = 1  # momentum_buffer

    name: str = "sgd"
    momentum: float = 0.9  # Nesterov momentum

    def check(self, cfg: RunConfig) -> None:
        super().check(cfg)
        require(
            self.momentum > 0,
            f"optim.momentum must be > 0 for optim=sgd (Nesterov momentum), got {self.momentum}; e.g. 0.9",
        )

    def build(self, groups: list[dict], lr: float, device: Any, capturable: bool = False) -> Any:
        import torch

        return torch.optim.SGD(groups, lr=lr, momentum=self.momentum, nesterov=True, foreach=capturable or None)

    def update(self, params: list, grads: list, state: list[dict], group: dict, lr: Any) -> None:
        from torch.optim.sgd import sgd  # what SGD.step calls

        sgd(
            params,
            grads,
            [s["momentum_buffer"] for s in state],
            foreach=True,
            weight_decay=group["weight_decay"],
            momentum=group["momentum"],
            lr=lr,
            dampening=group["dampening"],
            nesterov=group["nesterov"],
            maximize=False,
        )

    def init_state(self, optimizer: Any) -> None:
        """Momentum buffers at zero: the first step then sets each to its gradient, as torch's does (dampening 0)."""
        import torch

        for group in optimizer.param_groups:
            for p in group["params"]:
                if not optimizer.state[p]:
                    optimizer.state[p]["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)
