"""GEM, Gradient Episodic Memory (Lopez-Paz & Ranzato 2017): per-task memories whose losses must not increase.

Memory: at the end of task t, `buffer // n_tasks` images of task t, drawn at random from the task's
training images, are stored (non-augmented uint8, with their labels) and kept for the rest of the
stream. This is the reference framework's (mammoth's) GEM: its quota divides the buffer by the
benchmark's number of tasks, so the memory is split evenly over the tasks and full after the last
one; it is never rebalanced.

Step: g is the gradient of the cross-entropy on the stream batch (no replay in the loss). For every
past task k, g_k is the gradient of the cross-entropy on ALL of task k's memory, freshly augmented
(one forward/backward per past task, separate so that BatchNorm sees each task's batch alone, as
the reference does). If g . g_k < 0 for some k, g is replaced by the solution of GEM's dual QP

    min_v 1/2 v^T (G G^T + eps I) v + g^T G^T v   subject to   v >= margin,   g~ = G^T v + g

(G: the reference gradients as rows; `margin` is GEM's gamma, imposed on the dual variables as in
GEM's and the reference framework's code; eps = 1e-3 keeps the matrix positive definite, as theirs
does), solved with quadprog in float64 on the CPU. G G^T and G g are built where the gradients are, so
only the t x t system crosses to the host. Deciding whether to project reads one boolean on the host
per step once a memory exists (the one host synchronisation GEM needs: quadprog runs on the CPU).
"""
from __future__ import annotations

import numpy as np
import quadprog
import torch
import torch.nn.functional as F
from pydantic import Field

from gcl.methods.base import Method, MethodSettings, TaskData, register


def project(g: torch.Tensor, G_ref: torch.Tensor, margin: float, eps: float = 1e-3) -> torch.Tensor:
    """GEM's projection of the flat gradient `g` (p,) against the reference gradients `G_ref` (t, p).

    Returns `g` itself when no reference conflicts (every g . g_k >= 0); otherwise G^T v + g, with v
    the solution of the dual QP above, in `g`'s dtype and device. G G^T and G g are formed in float64
    where the gradients are (on the GPU: no copy of the t x p matrix to the host); only the t x t
    system goes to quadprog on the CPU, and only v (t numbers) comes back.
    """
    if G_ref.shape[0] == 0 or bool((G_ref @ g >= 0).all()):
        return g
    mem, grad = G_ref.detach().double(), g.detach().double()
    t = mem.shape[0]
    P = mem @ mem.T
    P = (0.5 * (P + P.T)).cpu().numpy() + eps * np.eye(t)
    q = -(mem @ grad).cpu().numpy()        # quadprog minimises 1/2 v'Pv - q'v
    v = quadprog.solve_qp(P, q, np.eye(t), np.full(t, float(margin)))[0]
    return (mem.T @ torch.from_numpy(v).to(mem.device) + grad).to(g.dtype)


class GEMSettings(MethodSettings):
    gamma: float = Field(0.5, ge=0, description="GEM's margin: lower bound on the dual variables of the QP")


@register
class GEM(Method):
    trains_alone = "it solves a quadratic programme on the host at every step, for one network"
    name = "gem"
    summary = "GEM: per-task episodic memories; the step is projected (QP) so no memory loss increases"
    needs_boundaries = True
    uses_buffer = True
    reservoir = False       # a memory of its own (below), not the shared reservoir
    Settings = GEMSettings
    state_attrs = ("mem_x", "mem_y", "mem_sizes")

    def __init__(self, net, cfg, ctx):
        super().__init__(net, cfg, ctx)
        self.mem_x: torch.Tensor | None = None      # uint8 images, task after task
        self.mem_y: torch.Tensor | None = None
        self.mem_sizes: list[int] = []               # images stored per past task, in task order

    def _flat_grad(self, loss: torch.Tensor) -> torch.Tensor:
        grads = torch.autograd.grad(loss, self.params, allow_unused=True)
        return torch.cat([(torch.zeros_like(p) if g is None else g).reshape(-1) for p, g in zip(self.params, grads)])

    def observe(self, x, y, x_raw):
        loss = F.cross_entropy(self.net(x), y)
        if not self.mem_sizes:
            return self.sgd_step(loss)
        g = self._flat_grad(loss)
        refs = []
        for mx, my in zip(torch.split(self.mem_x, self.mem_sizes), torch.split(self.mem_y, self.mem_sizes)):
            refs.append(self._flat_grad(F.cross_entropy(self.net(self.ctx.train_transform(mx)), my)))
        g = project(g, torch.stack(refs), self.cfg.gamma)
        for p, gp in zip(self.params, torch.split(g, [p.numel() for p in self.params])):
            p.grad = gp.view_as(p)
        self.apply_gradients()
        return loss.detach()

    def end_task(self, task: TaskData) -> None:
        n_tasks = self.ctx.n_classes // (task.classes[1] - task.classes[0])
        quota = min(self.cfg.buffer // n_tasks, len(task.y))
        if quota == 0:
            raise ValueError(f"gem: a buffer of {self.cfg.buffer} gives no image to each of {n_tasks} tasks")
        pick = torch.randperm(len(task.y), generator=self.ctx.generator)[:quota].to(task.y.device)
        new_x, new_y = task.x_raw.index_select(0, pick), task.y.index_select(0, pick)
        self.mem_x = new_x if self.mem_x is None else torch.cat([self.mem_x, new_x])
        self.mem_y = new_y if self.mem_y is None else torch.cat([self.mem_y, new_y])
        self.mem_sizes = self.mem_sizes + [quota]

    def extra_metrics(self) -> dict:
        return {"memory_per_task": list(self.mem_sizes)}
