"""ESMER: Error Sensitivity Modulation based Experience Replay (Sarfraz, Arani, Zonooz, "Error Sensitivity Modulation
based Experience Replay: Mitigating Abrupt Representation Drift in Continual Learning", ICLR 2023; the authors' code:
github.com/NeurAI-Lab/ESMER, models/esmer.py, on the mammoth framework).

A semantic memory (an exponential moving average of the working network's weights, like CLS-ER's stable one) and a
running mean mu of its per-sample cross-entropy on the stream. Each step, with l_i the memory's cross-entropy of
stream sample i and c_i the working network's:

    w_i   = mu / l_i  where l_i >= loss_margin * mu (a large error is scaled down to mu), else 1   (once mu > 0)
    L     = mean_i w_i c_i  +  [ CE(f(b_x), b_y) + reg_weight * MSE(f(b_x), memory(b_x)) ]   (once the buffer holds samples)

the modulation on the stream's loss only; the replayed batch (b_x, b_y) of `replay_batch`, augmented. One SGD step;
then the stream samples with l_i <= loss_margin * mu (all of them while mu = 0) are offered to the reservoir, and
no others; the step counter t += 1; the memory updated with probability `ema_update_freq`,

    theta_m <- a theta_m + (1 - a) theta,   a = min(1 - 1/(t + 1), ema_alpha);

and mu <- b mu + (1 - b) mean(l_i over the batch, the samples above mean + std_margin * std left out),
b = min(1 - 1/(t + 1), loss_alpha). The memory's cross-entropies come from its forward pass in training mode (its
BatchNorm statistics its own). The memory is the network evaluated (`evaluated_model: working` for the other).
Task-free: the reference's per-task warm-up (`task_warmup`, no reservoir and no mu update in a task's first epochs)
needs boundaries, and with one pass over each task it would leave the buffer empty; this is the reference at
task_warmup 0, its general-continual form.

The departures from the reference are in docs/methods.md ("esmer").
"""
from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from gcl.methods.base import Method, MethodContext, ReplaySettings, register
from gcl.methods.clser import evaluating, memory_copy, memory_decay, moving_average_step


def error_weights(memory_loss: torch.Tensor, running_mean: float, margin: float) -> torch.Tensor:
    """Per stream sample, the weight of its cross-entropy: running_mean / l where l >= margin * running_mean, else 1;
    all 1 while the running mean is 0 (before its first update)."""
    if running_mean <= 0:
        return torch.ones_like(memory_loss)
    return torch.where(memory_loss >= margin * running_mean, running_mean / memory_loss, torch.ones_like(memory_loss))


def kept_for_running_mean(memory_loss: torch.Tensor, std_margin: float) -> torch.Tensor:
    """The batch's memory losses that update the running mean: those not above mean + std_margin * std (the unbiased
    std; a batch of one has none, so its one loss is kept)."""
    if memory_loss.numel() < 2:                     # the reference's std is NaN then, and leaves nothing out
        return memory_loss
    return memory_loss[~(memory_loss > memory_loss.mean() + std_margin * memory_loss.std())]


class ESMERSettings(ReplaySettings):
    reg_weight: float = Field(0.1, ge=0, description="weight of the consistency (MSE) term towards the semantic "
                              "memory's logits on the replayed batch (the reference's default)")
    ema_update_freq: float = Field(0.7, ge=0, le=1, description="probability, each step, that the semantic memory is "
                                   "updated (the reference's ema_model_update_freq)")
    ema_alpha: float = Field(0.999, ge=0, le=1, description="decay of the semantic memory's moving average (capped at "
                             "1 - 1/(t+1) at step t; the reference's ema_model_alpha)")
    loss_margin: float = Field(1.0, gt=0, description="a stream sample whose memory cross-entropy is at least this "
                               "times the running mean is scaled down and kept out of the buffer")
    loss_alpha: float = Field(0.99, ge=0, le=1, description="decay of the running mean of the memory's cross-entropy "
                              "(capped at 1 - 1/(t+1))")
    std_margin: float = Field(1.0, ge=0, description="a batch's memory losses above mean + std_margin x std are left "
                              "out of the running mean's update")
    evaluated_model: Literal["memory", "working"] = Field("memory", description="the network evaluated: the semantic "
                                                          "memory (the paper's) or the working network")


@register
class ESMER(Method):
    trains_alone = ("each seed keeps its own number of stream samples (those its memory finds easy), which the stacked "
                    "buffer, one count for all seeds, does not hold")
    name = "esmer"
    summary = ("ESMER: ER whose stream loss is scaled down for samples of large error under a semantic memory (a "
               "moving average), which alone are kept out of the buffer (Sarfraz et al., ICLR 2023)")
    uses_buffer = True
    Settings = ESMERSettings
    state_attrs = ("memory", "global_step", "running_mean")

    def __init__(self, net: nn.Module, cfg: ESMERSettings, ctx: MethodContext):
        super().__init__(net, cfg, ctx)
        self.memory = memory_copy(net)
        self.global_step = 0
        self.running_mean = 0.0      # of the memory's cross-entropy on the stream (a Python float, as the reference's)
        self._net_params = list(net.parameters())

    def observe(self, x, y, x_raw):
        with torch.no_grad():
            memory_loss = F.cross_entropy(self.memory(x), y, reduction="none")
        weights = error_weights(memory_loss, self.running_mean, self.cfg.loss_margin)
        loss = (weights * F.cross_entropy(self.net(x), y, reduction="none")).mean()
        if not self.buffer.is_empty():
            buf_x, buf_y = self.replay_batch(self.cfg.replay_batch, "labels")
            with torch.no_grad():
                target = self.memory(buf_x)
            out = self.net(buf_x)
            loss = loss + F.cross_entropy(out, buf_y) + self.cfg.reg_weight * F.mse_loss(out, target)
        loss = self.sgd_step(loss)
        selected = ~(memory_loss > self.cfg.loss_margin * self.running_mean) if self.running_mean > 0 else \
            torch.ones_like(y, dtype=torch.bool)
        if bool(y[selected].any()):     # the reference's test: a batch whose selected labels are all 0 adds nothing
            self.buffer.add(examples=x_raw[selected], labels=y[selected])
        self.global_step += 1
        if torch.rand(1, generator=self.ctx.generator, dtype=torch.float64).item() < self.cfg.ema_update_freq:
            moving_average_step(self.memory, self._net_params, memory_decay(self.global_step, self.cfg.ema_alpha))
        kept = kept_for_running_mean(memory_loss, self.cfg.std_margin)
        b = memory_decay(self.global_step, self.cfg.loss_alpha)
        self.running_mean = b * self.running_mean + (1 - b) * float(kept.mean())
        return loss

    def evaluated(self) -> nn.Module:
        return self.memory if self.cfg.evaluated_model == "memory" else self.net

    @torch.no_grad()
    def predict(self, x: torch.Tensor) -> torch.Tensor:
        with evaluating(self.evaluated(), self.net) as model:
            return model(x)

    @torch.no_grad()
    def features(self, x: torch.Tensor) -> torch.Tensor:
        with evaluating(self.evaluated(), self.net) as model:
            return model.features(x)
