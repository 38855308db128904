"""Synaptic Intelligence (Zenke, Poole & Ganguli 2017): importance from the path integral of the loss.

During a task every update adds, per parameter, its contribution to the drop of the task loss,

    omega += -g * delta_theta          (g: gradient of the task loss alone, delta_theta: the update made),

and at the task's end the importance is consolidated and the running sum reset:

    Omega += omega / ((theta_end - theta_start)^2 + xi),   omega <- 0,   theta* <- theta_end.

Every later step minimises CE + c * sum_i Omega_i (theta_i - theta*_i)^2.

Against the reference framework (mammoth's `si`):

- g is the gradient of the cross-entropy alone, as in the SI paper (the surrogate loss must not count
  as the task's progress). The reference accumulates lr * g_total^2, i.e. -g_total * delta_theta with
  g_total the (clipped) gradient of cross-entropy + penalty: the same thing during the first task, a
  different one afterwards. Here delta_theta = -lr * (the applied, clipped total gradient), exactly the
  plain-SGD update, so omega += lr * g_task * g_applied.
- Like the reference, the applied gradient is clipped element-wise to [-clip, clip] (its
  clip_grad_value_ at 1); `clip: 0` turns that off.
- theta_start of the first task is the initial network, as in the reference.
- The penalty enters through its exact gradient 2 c Omega (theta - theta*) (multi-tensor ops); the
  returned loss includes its value.
"""
from __future__ import annotations

import torch
from pydantic import Field

from gcl.methods.base import MethodSettings, TaskData, register
from gcl.methods.quadratic import QuadraticPenaltyMethod


class SISettings(MethodSettings):
    c: float = Field(ge=0, description="weight c of the surrogate penalty sum Omega (theta - theta*)^2")
    xi: float = Field(1.0, gt=0, description="damping xi in Omega += omega / (delta_theta^2 + xi)")
    clip: float = Field(1.0, ge=0, description="clip each applied gradient element to [-clip, clip] (reference: 1); 0: off")


@register
class SI(QuadraticPenaltyMethod):
    name = "si"
    summary = "Synaptic Intelligence: quadratic penalty weighted by each parameter's path-integral importance"
    needs_boundaries = True
    Settings = SISettings
    state_attrs = ("omega", "big_omega", "checkpoint")

    @property
    def importance(self) -> list[torch.Tensor] | None:
        return self.big_omega

    @property
    def penalty_weight(self) -> float:
        return self.cfg.c

    def __init__(self, net, cfg, ctx):
        super().__init__(net, cfg, ctx)
        self.omega = [torch.zeros_like(p) for p in self.params]             # path integral of this task
        self.big_omega: list[torch.Tensor] | None = None                  # consolidated importance
        self.checkpoint = [p.detach().clone() for p in self.params]        # theta at this task's start = theta*

    def observe(self, x, y, x_raw):
        loss = self.task_loss_gradients(x, y)
        with torch.no_grad():
            g_task = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
            if self.big_omega is not None:
                weighted, value = self._penalty_terms()
                applied = torch._foreach_add(g_task, weighted, alpha=2 * self.cfg.c)
                loss = loss + value
            else:
                applied = [g.clone() for g in g_task]
            if self.cfg.clip > 0:
                torch._foreach_clamp_min_(applied, -self.cfg.clip)
                torch._foreach_clamp_max_(applied, self.cfg.clip)
            # delta_theta = -lr * applied, so -g_task * delta_theta = lr * g_task * applied
            torch._foreach_add_(self.omega, torch._foreach_mul(g_task, applied), alpha=self.cfg.lr)
        for p, a in zip(self.params, applied):
            p.grad = a
        self.apply_gradients()
        return loss

    @torch.no_grad()
    def end_task(self, task: TaskData) -> None:
        now = [p.detach().clone() for p in self.params]
        moved = torch._foreach_sub(now, self.checkpoint)
        denominator = torch._foreach_add(torch._foreach_mul(moved, moved), self.cfg.xi)
        gained = torch._foreach_div(self.omega, denominator)
        if self.big_omega is None:
            self.big_omega = gained
        else:
            torch._foreach_add_(self.big_omega, gained)
        self.checkpoint = now
        self.omega = [torch.zeros_like(p) for p in self.params]
