"""CLS-ER: Experience Replay with a plastic and a stable semantic memory (Arani, Sarfraz, Zonooz, "Learning
Fast, Learning Slow: A General Continual Learning Method based on Complementary Learning System", ICLR 2022;
the authors' code: github.com/NeurAI-Lab/CLS-ER, models/clser.py, on the mammoth framework).

Two exponential moving averages of the working network's weights: the plastic memory (frequent, fast) and
the stable memory (rare, slow). Each step, with a replayed batch (b_x, b_y) once the buffer holds samples:

    L = CE(f([x; b_x]), [y; b_y])  +  reg_weight * MSE(f(b_x), z)

one cross-entropy over the stream batch and the replayed batch concatenated (ER's), and the mean squared
error between the working network's logits of the replayed batch and z: per sample, the logits of whichever
memory gives the sample's true class the higher softmax probability (the stable one only when strictly
higher). Then, in the authors' order: one SGD step, the stream batch (non-augmented) offered to the
reservoir, the step counter t += 1, and each memory updated with probability r (`plastic_update_freq`,
then `stable_update_freq`, one draw each, every step):

    theta_m <- a theta_m + (1 - a) theta,   a = min(1 - 1 / (t + 1), alpha_m)

over the parameters only (a memory's BatchNorm statistics are its own, see below). The stable memory is the
one evaluated (`predict`, `features`). No task boundaries.

As in the authors' code: one replayed batch, augmented once, feeds the memories, the consistency term and
the cross-entropy; the consistency term has its own forward pass of the replayed batch, before the
concatenated one; the memories run in training mode while the method trains (with BatchNorm: batch
statistics, and running statistics updated by their own forward passes of the replayed batches) and in eval
mode when evaluated; they start as copies of the initial network.

Departures from the authors' code:
- The two update decisions come from the run's generator (`ctx.generator`, two draws every step), not from
  torch's global generator, so a checkpoint resumes them exactly; the decisions are the same in law.
- Setting names: reg_weight as theirs; `plastic_update_freq`, `plastic_alpha`, `stable_update_freq`,
  `stable_alpha` for their `plastic_model_update_freq`, `plastic_model_alpha`, ... The defaults are their
  parser's (reg_weight 0.1, plastic 0.9 / 0.999, stable 0.7 / 0.999); their best arguments per benchmark
  and buffer are in the profiles.
- `evaluated_model` (default `stable`) names the network evaluated. Their general-continual loop
  (utils/continual_training.py, MNIST-360) compares the names it passes ('stable_model', 'plastic_model')
  with others ('stable_ema_model', ...), so there it evaluates the working network: `working` reproduces that.
- Memories are updated inside one no-grad multi-tensor operation (the same arithmetic: a * m + (1 - a) * p),
  and the memories' forward passes run without autograd (their logits were detached there anyway).
"""
from __future__ import annotations

import copy
from contextlib import contextmanager
from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from gcl.methods.base import Method, MethodContext, ReplaySettings, register, weights_changed


def memory_targets(stable_logits: torch.Tensor, plastic_logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Per sample, the stable memory's logits where its softmax probability of the true class `y` is strictly
    higher than the plastic memory's, else the plastic memory's."""
    p_stable = F.softmax(stable_logits, 1).gather(1, y[:, None])
    p_plastic = F.softmax(plastic_logits, 1).gather(1, y[:, None])
    return torch.where(p_stable > p_plastic, stable_logits, plastic_logits)


def memory_draws(generator: torch.Generator) -> tuple[float, float]:
    """A step's two uniform draws (plastic, stable) from a run's generator: each memory is updated where its draw
    is below its update frequency."""
    plastic, stable = torch.rand(2, generator=generator, dtype=torch.float64).tolist()
    return plastic, stable


def memory_copy(net: nn.Module) -> nn.Module:
    """A moving-average memory of `net`: a copy in training mode whose parameters take no gradient."""
    memory = copy.deepcopy(net).train()
    memory.requires_grad_(False)
    return memory


@torch.no_grad()
def moving_average_step(memory: nn.Module, net_params: list[torch.Tensor], a: float) -> None:
    """memory <- a * memory + (1 - a) * net over the parameters (its buffers, BatchNorm's statistics, are its own), in
    one multi-tensor operation."""
    params = list(memory.parameters())
    torch._foreach_mul_(params, a)
    torch._foreach_add_(params, net_params, alpha=1.0 - a)
    weights_changed()


@torch.no_grad()
def masked_average_step(memory: nn.Module, net_params: list[torch.Tensor], a: float, chosen: torch.Tensor) -> None:
    """moving_average_step in the stacked seeds `chosen` (S,) only: a and 1 - a each rounded once to the weights'
    type, as the lone step's factors are; 1 and 0 in the other seeds."""
    dtype = net_params[0].dtype
    keep, move = (torch.where(chosen, f, other).to(dtype) for f, other in ((a, 1.0), (1.0 - a, 0.0)))
    for m, p in zip(memory.parameters(), net_params):
        shape = (-1, *[1] * (m.dim() - 1))
        m.mul_(keep.view(shape)).add_(p * move.view(shape))
    weights_changed()


def memory_decay(global_step: int, alpha: float) -> float:
    """The moving average's decay after `global_step` steps: min(1 - 1/(global_step + 1), alpha)."""
    return min(1.0 - 1.0 / (global_step + 1), alpha)


class CLSERSettings(ReplaySettings):
    reg_weight: float = Field(0.1, ge=0, description="weight of the consistency (MSE) term towards the memories' "
                                                     "logits on the replayed batch")
    plastic_update_freq: float = Field(0.9, ge=0, le=1, description="probability, each step, that the plastic "
                                                                    "memory is updated")
    plastic_alpha: float = Field(0.999, ge=0, le=1, description="decay of the plastic memory's moving average "
                                                                "(capped at 1 - 1/(t+1) at step t)")
    stable_update_freq: float = Field(0.7, ge=0, le=1, description="probability, each step, that the stable "
                                                                   "memory is updated")
    stable_alpha: float = Field(0.999, ge=0, le=1, description="decay of the stable memory's moving average "
                                                               "(capped at 1 - 1/(t+1) at step t)")
    evaluated_model: Literal["stable", "plastic", "working"] = Field(
        "stable", description="the network evaluated: the stable memory (the paper's), the plastic one, or the "
                              "working network (what the authors' MNIST-360 loop evaluates)")


@register
class CLSER(Method):
    name = "clser"
    capturable = True
    summary = ("CLS-ER: ER plus a consistency loss towards a plastic and a stable moving-average memory; the stable "
               "one is evaluated (Arani et al., ICLR 2022)")
    uses_buffer = True
    Settings = CLSERSettings
    state_attrs = ("plastic", "stable", "global_step")

    def __init__(self, net: nn.Module, cfg: CLSERSettings, ctx: MethodContext):
        super().__init__(net, cfg, ctx)
        self.plastic = memory_copy(net)
        self.stable = memory_copy(net)
        self.global_step = 0     # steps taken (the authors' global_step), for the decay's warm-up cap
        self._net_params = list(net.parameters())

    # ------------------------------------------------------------------ training

    def loss(self, x: torch.Tensor, y: torch.Tensor, buf_x: torch.Tensor | None = None,
             buf_y: torch.Tensor | None = None) -> torch.Tensor:
        """CE over [x; buf_x] plus reg_weight * MSE(f(buf_x), memory_targets); the CE alone without a buffer batch."""
        seeds = self.seeds
        if buf_x is None:
            return seeds.cross_entropy(self.net(x), y)
        with torch.no_grad():
            target = seeds.per_sample(memory_targets, self.stable(buf_x), self.plastic(buf_x), buf_y)
        consistency = seeds.mse(self.net(buf_x), target)
        ce = seeds.cross_entropy(self.net(seeds.cat([x, buf_x])), seeds.cat([y, buf_y]))
        return self.cfg.reg_weight * consistency + ce

    def observe(self, x, y, x_raw):
        cfg = self.cfg
        replay = ()
        if not self.buffer.is_empty():
            replay = self.replay_batch(cfg.replay_batch, "labels")
        loss = self.sgd_step(self.loss(x, y, *replay))
        self.buffer.add(examples=x_raw, labels=y)
        self.global_step += 1
        draws = self.seeds.each(memory_draws)              # each seed's (plastic, stable) draws
        self.update_memory(self.plastic, cfg.plastic_alpha, [p < cfg.plastic_update_freq for p, _ in draws])
        self.update_memory(self.stable, cfg.stable_alpha, [s < cfg.stable_update_freq for _, s in draws])
        return loss

    def update_memory(self, memory: nn.Module, alpha: float, chosen: list[bool]) -> None:
        """memory <- a * memory + (1 - a) * net over the parameters, a = min(1 - 1/(global_step + 1), alpha), in
        the seeds `chosen` (the others' memories left as they are)."""
        a = memory_decay(self.global_step, alpha)
        if all(chosen) and not self.seeds.stacked:
            moving_average_step(memory, self._net_params, a)
        elif any(chosen):
            masked_average_step(memory, self._net_params, a, torch.tensor(chosen, device=self.ctx.device))

    # ------------------------------------------------------------------ evaluation

    def evaluated(self) -> nn.Module:
        return {"stable": self.stable, "plastic": self.plastic, "working": self.net}[self.cfg.evaluated_model]

    @torch.no_grad()
    def predict(self, x: torch.Tensor) -> torch.Tensor:
        with evaluating(self.evaluated(), self.net) as model:
            return model(x)

    @torch.no_grad()
    def features(self, x: torch.Tensor) -> torch.Tensor:
        with evaluating(self.evaluated(), self.net) as model:
            return model.features(x)


@contextmanager
def evaluating(model: nn.Module, working: nn.Module):
    """`model` (a memory of the working network, or that network) in eval mode, its mode restored afterwards; the
    working network's own mode is the loop's business, left as it is."""
    if model is working:
        yield model
        return
    mode = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(mode)
