"""The quadratic penalty of the regularisation baselines: weight * sum_k importance_k (theta_k - anchor_k)^2,
with oEWC's running Fisher or SI's Omega as the importance and the parameters at a task's end as the anchor."""
from __future__ import annotations

import torch

from gcl.methods.base import Method


@torch.no_grad()
def penalty_terms(params: list[torch.Tensor], anchor: list[torch.Tensor], importance: list[torch.Tensor],
                  weight: float) -> tuple[list[torch.Tensor], torch.Tensor]:
    """importance * (theta - anchor) per parameter (half the penalty's gradient, over the weight) and the
    penalty's value, without building a graph."""
    diff = torch._foreach_sub([p.detach() for p in params], anchor)
    weighted = torch._foreach_mul(diff, importance)
    value = torch.stack([(w * d).sum() for w, d in zip(weighted, diff)]).sum()
    return weighted, weight * value


def penalty(params: list[torch.Tensor], anchor: list[torch.Tensor] | None, importance: list[torch.Tensor] | None,
            weight: float, device: torch.device) -> torch.Tensor:
    """The penalty as a differentiable function of the parameters (0 before the first task ends)."""
    if importance is None:
        return torch.zeros((), device=device)
    return weight * sum((f * (p - c).pow(2)).sum() for p, f, c in zip(params, importance, anchor))


class QuadraticPenaltyMethod(Method):
    """A method whose penalty is weight * sum importance (theta - theta*)^2: oEWC and SI. Subclasses say where
    the importance and the weight are (`importance`, `penalty_weight`) and keep theta* in `checkpoint`."""
    trains_alone = "it works at task boundaries, which stacked seeds do not see"

    checkpoint: list[torch.Tensor] | None

    @property
    def importance(self) -> list[torch.Tensor] | None:
        """The importance of each parameter (None before the first task ends)."""
        raise NotImplementedError

    @property
    def penalty_weight(self) -> float:
        raise NotImplementedError

    def _penalty_terms(self) -> tuple[list[torch.Tensor], torch.Tensor]:
        """importance * (theta - theta*) per parameter and the penalty's value."""
        return penalty_terms(self.params, self.checkpoint, self.importance, self.penalty_weight)

    def penalty(self) -> torch.Tensor:
        """The penalty as a differentiable function of the parameters (0 before the first task ends)."""
        return penalty(self.params, self.checkpoint, self.importance, self.penalty_weight, self.ctx.device)

    def task_loss_gradients(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Cross-entropy of the batch, its gradient left in every .grad; returns the detached loss."""
        loss = torch.nn.functional.cross_entropy(self.net(x), y)
        for p in self.params:
            p.grad = None
        loss.backward()
        return loss.detach()
