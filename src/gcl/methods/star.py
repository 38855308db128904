"""STAR, a plug-in on a replay method (Eskandar, Imtiaz, Hill, Wang, Dy, "STAR: Stability-Inducing Weight
Perturbation for Continual Learning", ICLR 2025; the reference: aimagelab/mammoth, models/er_star.py,
models/derpp_star.py and models/star_utils/star_perturber.py, the authors' official version there).

Each step, once the buffer holds samples, before the base method's own step: a buffer batch (b_x, b_y) of
`replay_batch`, augmented, and

    p      = softmax(f(b_x; theta))                        no gradient; the targets
    m_i    = [argmax_c p_ic == b_y_i]                      the correctly classified samples (star_samples)
    KL(t)  = sum_i m_i KL(p_i || softmax(f(b_x_i; t))) / sum_i m_i

If fewer than `min_correct` samples are correct, the step is the base method's alone. Otherwise the perturbation
delta: a proxy copy of the network starts at theta (plus a relative Gaussian noise of `init_noise`) and makes
`ascent_steps` normalised gradient-ascent steps on KL, each moving every weight matrix W (every parameter of
two or more dimensions; biases and normalisation parameters stay) by

    (gamma / ascent_steps) * ||W|| * g_W / (||g_W|| + 1e-20),     g_W = dKL / dW at the proxy's weights

with ||W|| the unperturbed weight's norm: one step moves each matrix by gamma times its own norm. The STAR
term's gradient lam * dKL(t) / dt is then taken at t = theta + delta (the network's weights set to the proxy's)
and added to the gradient of the base method's loss, taken at theta once the weights are restored: one SGD
step with the sum. The loss returned is the base method's.

Where the draws come from: the buffer batch from the run's generator (`ctx.generator`, the buffer's sampler), before
the base method's draws, as the reference draws from its one sampler; the initial noise from torch's global
generator on the training device (`torch.randn_like`, as the reference), which the loop seeds and a checkpoint
saves and restores. With `lam: 0` STAR draws nothing and makes no pass: the method is its base method exactly.

The departures from the reference are listed in docs/methods.md ("er-star, derpp-star").
"""
from __future__ import annotations

import copy
from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field, model_validator
from torch import nn

from gcl.core.settings import Settings
from gcl.methods.base import Method, MethodContext, register, weights_changed
from gcl.methods.der import DERpp, DERppSettings
from gcl.methods.er import ER, ERSettings

NORM_EPS = 1e-20   # added to a gradient's norm before it is divided by it (the reference's)


class STARSettings(Settings):
    """STAR's own settings, beside its base method's."""

    gamma: float = Field(0.05, gt=0, description="the perturbation's step size gamma: an ascent step moves each weight "
                         "matrix by gamma x its own norm (mammoth's p_gamma; its default 0.05)")
    lam: float = Field(0.01, ge=0, description="the KL term's weight lambda (mammoth's p_lam; its default 0.01); 0: no "
                       "STAR term, no draw, no pass (the base method exactly)")
    ascent_steps: int = Field(1, ge=1, description="normalised gradient-ascent steps that find the perturbation, each "
                              "of gamma / ascent_steps (mammoth's p_steps; its default 1)")
    init_noise: float = Field(1e-20, ge=0, description="the proxy's random start: Gaussian noise of this std times each "
                              "weight matrix's norm (mammoth's fixed 1e-20, below float32 resolution; 0: none)")
    star_samples: Literal["correct", "all"] = Field(
        "correct", description="the buffer samples the KL runs over: correct, those the network classifies correctly "
        "(the paper's and mammoth's); all, every sample of the STAR batch")
    min_correct: int = Field(2, ge=1, description="fewer counted samples than this in a STAR batch: no STAR term that "
                             "step (mammoth's rule: 2)")

    @model_validator(mode="after")
    def _reachable(self):
        replay = getattr(self, "replay_batch", None)
        if replay is not None and self.min_correct > replay:
            raise ValueError(f"min_correct ({self.min_correct}) exceeds replay_batch ({replay}), the size of the batch "
                             "the kl term runs over: no step would have the term")
        return self


def masked_kl(logits: torch.Tensor, target: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The mean over the samples where `mask` is 1 of KL(target_i || softmax(logits_i)) (`target`: probabilities)."""
    per_sample = F.kl_div(F.log_softmax(logits, 1), target, reduction="none").sum(1)
    return (per_sample * mask).sum() / mask.sum()


def perturbed_params(net: nn.Module) -> list[nn.Parameter]:
    """The parameters STAR perturbs: those of two or more dimensions (weight matrices, convolution kernels)."""
    return [p for p in net.parameters() if p.dim() > 1]


def has_running_stats(net: nn.Module) -> bool:
    return any(isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats for m in net.modules())


class STAR(Method):
    """The plug-in: a base replay method (ER, DER++) after it in the bases, whose update (`sgd_step`) adds STAR's
    `extra_gradients` to its own (STARSettings in its Settings)."""
    trains_alone = ("its step branches on how many buffer samples each seed's network classifies correctly, a decision "
                    "taken on the host for one network")

    capturable = False   # a host synchronisation (the count of correct samples) and a data-dependent branch per step
    state_attrs = ("star_steps",)

    def __init__(self, net: nn.Module, cfg, ctx: MethodContext):
        super().__init__(net, cfg, ctx)
        self.proxy = copy.deepcopy(net).train()   # scratch: set from the network at every STAR step
        self.star_steps = 0          # steps whose gradient had a STAR term (extra_metrics)
        self._weights = perturbed_params(net)
        self._proxy_weights = perturbed_params(self.proxy)
        # what the proxy takes from the network at every STAR step: its parameters and buffers, in one order
        self._net_state = [*net.parameters(), *net.buffers()]
        self._proxy_state = [*self.proxy.parameters(), *self.proxy.buffers()]
        self._running_stats = has_running_stats(net)

    # ------------------------------------------------------------------ the step

    def extra_gradients(self) -> list[torch.Tensor | None] | None:
        """STAR's gradient at the perturbed weights (None: no term this step: lam 0, an empty buffer, or too few
        correct samples); its buffer batch drawn before the base method's draws, as the reference draws."""
        if self.cfg.lam == 0 or self.buffer.is_empty():
            return None
        buf_x, buf_y = self.replay_batch(self.cfg.replay_batch, "labels")
        return self.star_gradients(buf_x, buf_y)

    def counted(self, target: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """1 for each sample the KL runs over (the correctly classified ones, or all), else 0."""
        if self.cfg.star_samples == "all":
            return torch.ones_like(y, dtype=target.dtype)
        return (target.argmax(1) == y).to(target.dtype)

    def star_gradients(self, buf_x: torch.Tensor, buf_y: torch.Tensor) -> list[torch.Tensor | None] | None:
        """lam * dKL/dt at t = theta + delta for each of `self.params` (None: no STAR term this step). Leaves the
        network's weights as they were."""
        with torch.no_grad():
            target = F.softmax(self.net(buf_x), 1)
        mask = self.counted(target, buf_y)
        if int(mask.sum()) < self.cfg.min_correct:
            if self._running_stats:
                # the reference still passes the batch through the (unperturbed) network, which moves BatchNorm's
                # running statistics; kept, so that such a network evaluates as the reference's would
                with torch.no_grad():
                    self.net(buf_x)
            return None
        proxy_weights = self.perturbation(buf_x, target, mask)
        with torch.no_grad():
            saved = torch._foreach_mul(self._weights, 1.0)     # copies of the unperturbed weights
            torch._foreach_copy_(self._weights, proxy_weights)
        weights_changed()
        try:
            kl = self.cfg.lam * masked_kl(self.net(buf_x), target, mask)
            grads = torch.autograd.grad(kl, self.params, allow_unused=True)
        finally:
            with torch.no_grad():
                torch._foreach_copy_(self._weights, saved)
            weights_changed()
        self.star_steps += 1
        return list(grads)

    def perturbation(self, buf_x: torch.Tensor, target: torch.Tensor, mask: torch.Tensor) -> list[torch.Tensor]:
        """The proxy's weight matrices theta + delta after the normalised ascent on KL (the proxy starts at the
        network's weights and buffers, plus the initial noise)."""
        proxy, weights = self.proxy, self._proxy_weights
        with torch.no_grad():
            torch._foreach_copy_(self._proxy_state, self._net_state)
            norms = [w.norm() for w in self._weights]
            if self.cfg.init_noise > 0:
                for q, n in zip(weights, norms):
                    q.add_(torch.randn_like(q) * n * self.cfg.init_noise)
        weights_changed()
        step = self.cfg.gamma / self.cfg.ascent_steps
        for _ in range(self.cfg.ascent_steps):
            grads = torch.autograd.grad(masked_kl(proxy(buf_x), target, mask), weights)
            with torch.no_grad():
                for q, g, n in zip(weights, grads, norms):
                    q.add_(g * (n / (g.norm() + NORM_EPS)), alpha=step)
            weights_changed()
        return [q.detach() for q in weights]

    def extra_metrics(self) -> dict:
        return {**super().extra_metrics(), "star_steps": self.star_steps}


class ERSTARSettings(STARSettings, ERSettings):
    pass


class DERppSTARSettings(STARSettings, DERppSettings):
    pass


@register
class ERSTAR(STAR, ER):
    name = "er-star"
    summary = ("ER plus STAR: a KL term on correctly classified buffer samples between the network and its worst-case "
               "weight perturbation, its gradient taken at the perturbed weights (Eskandar et al., ICLR 2025)")
    Settings = ERSTARSettings


@register
class DERppSTAR(STAR, DERpp):
    name = "derpp-star"
    summary = ("DER++ plus STAR: a KL term on correctly classified buffer samples between the network and its "
               "worst-case weight perturbation, its gradient taken at the perturbed weights (Eskandar et al., ICLR 2025)")
    Settings = DERppSTARSettings
