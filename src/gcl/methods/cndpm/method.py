"""CN-DPM (Lee, Ha, Zhang, Kim, ICLR 2020): a neural Dirichlet process mixture of experts, task-free.

Each expert k pairs a classifier p(y | x; phi_k^D) with a VAE density model p(x; phi_k^G), so the mixture
models p(x, y) = sum_k pi_k p(x | k) p(y | x, k) (the paper's Eq. 7). The method never sees task boundaries.

Prior. Counts N_k are kept in log space (`log_counts`); slot 0 stands for "a new expert" with N_0 = alpha
(`log_alpha`), never changed. A wake step adds each expert's summed responsibilities over the batch to its
count (every sample of the batch, also those sent to the short-term memory, as the authors' code does);
an expert made in sleep starts at N = |STM| + 1 (the code's add_expert, count 1, then + |STM|).

Expert 0. A frozen, randomly initialised expert of the base architecture (its VAE and classifier are never
updated): its negative log-likelihood with the prior weight alpha is the likelihood of a new expert
(Eq. 8, phi_0 ~ G_0 sampled once).

Wake (one stream batch). For every expert, NLL_k(x, y) = VAE negative ELBO (16 latent samples, the ELBOs
averaged, Gaussian likelihood of unit variance summed over all pixels, sigmoid mean, analytic KL) + the
classifier's "chilled" NLL, whose value is the cross-entropy of log_softmax(log p(y|x) / chill) and whose
gradient is the plain cross-entropy's (straight-through). Each sample goes, by argmin_k NLL_k - log N_k,
to an existing expert or (k = 0) to the short-term memory (STM). Responsibilities over the existing experts
(softmax of -NLL + log N with the new-expert column zeroed, computed without gradient) weight the
per-sample NLLs, summed over the batch with the STM-bound samples masked out; one Adam step per batch
(gradients clipped by value) for every expert whose batch usage exceeds `update_min_usage`.

Sleep (when the STM holds `stm_capacity` samples or more). A new expert is built, its VAE trained first
(`sleep_steps_vae` Adam steps) and then its classifier (`sleep_steps_cls` steps), each step on a batch of
`sleep_batch` STM samples drawn with replacement, with an explicit L2 penalty `weight_decay` * sum ||theta||^2;
afterwards both learning rates are multiplied by `lr_decay` for the wake phase (the Adam state carries over),
and the STM is emptied.

Lateral connections (parameter sharing). Every layer of expert k >= 2 but its VAE decoder also reads the
detached, concatenated features of all earlier experts (expert 1's and the `*_ext`-wide additions of each
later one), so no gradient reaches an earlier expert; decoders are never shared and always base width.
Architectures, widths and the parameter counts follow the authors' code: MNIST (`arch: mlp`) MLP VAE
784-64-64 (z 16) / classifier 784-64-64-10, +16 units per expert (5 experts = 524,130 parameters);
CIFAR (`arch: cnn`) conv VAE 32/64 channels, fc 128, z 64, decoder by transposed convs / a 10-layer ResNet
with InstanceNorm (no affine), widths 20-40-80-160, strides 1,2,2,2, +4 channels per expert.

Test time. log p(x, y = c) = logsumexp_k [log pi_k - NLL_VAE,k(x) + log p_k(y = c | x)] over the existing
experts with pi_k = N_k / sum N (expert 0 excluded) and the unchilled classifier; `predict` returns these
scores, whose argmax is the mixture's prediction. Before the first sleep there is no expert: all scores 0.

Simplifications against the authors' code (none changes a decision or a gradient): the additive constants of
the Gaussian NLL (0.5 log 2 pi and the 0.001 noise floor per pixel) are dropped, identical for every expert
and the placeholder, so argmin, responsibilities, gradients and the test-time argmax are unchanged; the
MultiStepLR schedule is "lr *= lr_decay after sleep"; lateral features are passed as a list (not the code's
recursive chain), and in sleep the earlier experts' (frozen) features of the STM are computed once instead of
per batch (the same values); Adam is written out (torch.optim.Adam's update, eps 1e-8, betas 0.9/0.999) over
one flat tensor per VAE and per classifier, with its moments held as buffers of each expert, so that
checkpoints carry them, and with the "skip this expert"
decision applied as a 0/1 mask on the device instead of a host-side branch; no sleep validation split
(the code's sleep_val_size is 0). A runaway expert count (more than `max_experts`) stops the run with an
error naming log_alpha instead of filling memory.

Protocol: CN-DPM's NLL scale, hence log_alpha, assumes pixels in [0, 1] (sequential benchmarks with
`normalize: false`, `augment: false`). The project's sequential stream makes one shuffled pass over each
task without replacement (the authors' Split-MNIST episode drew its 6,000 batches with replacement; their
CIFAR episodes, like this stream, make one pass). The backbone the training loop builds is not used: the
report's t-SNE and the loop's collapse check read the experts' classifier features (`features`).
"""
from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from gcl.core.errors import UserError
from gcl.methods.base import Method, MethodSettings, register
from gcl.methods.cndpm.experts import Expert, vae_nll


def chilled_nll(log_probs: torch.Tensor, y: torch.Tensor, chill: float) -> torch.Tensor:
    """Per-sample NLL whose value is the cross-entropy of log_softmax(log p / chill) (the classifier
    sharpened by the temperature `chill`) and whose gradient is the plain cross-entropy's."""
    plain = F.nll_loss(log_probs, y, reduction="none")
    chilled = F.nll_loss(F.log_softmax(log_probs.detach() / chill, 1), y, reduction="none")
    return plain - plain.detach() + chilled


# ------------------------------------------------------------------------------------------ method

class NoExpertError(UserError, RuntimeError):
    """The stream ended before CN-DPM made its first expert."""


class CNDPMSettings(MethodSettings):
    lr: float = Field(gt=0, description="Adam learning rate of the classifiers (sleep; wake after lr_decay)")
    lr_vae: float = Field(gt=0, description="Adam learning rate of the VAEs (sleep; wake after lr_decay)")
    arch: Literal["mlp", "cnn"] = Field(description="experts for MNIST (MLPs) or CIFAR (conv VAE + ResNet-10)")
    log_alpha: float = Field(description="log of the DP concentration alpha: the prior count of a new expert")
    classifier_chill: float = Field(0.01, gt=0, description="temperature of the classifier NLL used to pick experts")
    stm_capacity: int = Field(gt=0, description="short-term memory size that triggers a sleep phase")
    sleep_steps_vae: int = Field(gt=0, description="Adam steps that train a new expert's VAE in sleep")
    sleep_steps_cls: int = Field(gt=0, description="Adam steps that then train its classifier")
    sleep_batch: int = Field(50, gt=0, description="STM samples per sleep step (drawn with replacement)")
    lr_decay: float = Field(1.0, gt=0, le=1, description="factor on a new expert's learning rates after its sleep")
    update_min_usage: float = Field(0.0, ge=0, description="wake: experts with at most this batch usage are not stepped")
    weight_decay: float = Field(1e-5, ge=0, description="explicit L2 coefficient in sleep (none in wake)")
    clip: float = Field(0.5, gt=0, description="gradients clipped by value to [-clip, clip]")
    z_dim: int = Field(gt=0, description="VAE latent size")
    z_samples: int = Field(16, gt=0, description="latent samples whose ELBOs are averaged")
    vae_width: int = Field(gt=0, description="first expert's VAE width (units or channels)")
    vae_ext: int = Field(gt=0, description="VAE encoder width each later expert adds")
    cls_width: int = Field(gt=0, description="first expert's classifier width")
    cls_ext: int = Field(gt=0, description="classifier width each later expert adds")
    max_experts: int = Field(100, gt=0, description="stop the run when more experts are made (alpha too large)")


@register
class CNDPM(Method):
    trains_alone = "its experts grow as it trains, each seed its own number of them"
    name = "cndpm"
    summary = "CN-DPM: Dirichlet-process mixture of VAE+classifier experts, new experts trained in sleep from a short-term memory"
    needs_boundaries = False
    uses_buffer = False
    heads = ("linear",)       # it predicts with its experts, not with the backbone's head
    Settings = CNDPMSettings
    state_attrs = ("experts", "log_counts", "stm_x", "stm_y", "stm_n")

    def __init__(self, net, cfg, ctx):
        super().__init__(net, cfg, ctx)
        self.params = []   # the project's backbone is not used: the experts are the model
        self.in_shape = None
        self.experts = nn.ModuleList()
        self.log_counts = torch.tensor([float(cfg.log_alpha)], device=ctx.device)   # slot 0: N_0 = alpha
        self.stm_x = self.stm_y = None
        self.stm_n = torch.zeros((), dtype=torch.long, device=ctx.device)
        self._stm_bound = 0   # host-side upper bound of stm_n: read stm_n only when a sleep may be due

    # -------------------------------------------------------------- construction

    def _setup(self, x: torch.Tensor) -> None:
        """Expert 0 and the STM, sized from the first batch's image shape."""
        self.in_shape = tuple(x.shape[1:])
        self.experts.append(Expert(self.cfg, self.in_shape, self.ctx.n_classes, 0, self.ctx.device, frozen=True))
        # a batch may overshoot the capacity by batch - 1 samples; one spare slot takes the samples not sent
        slots = self.cfg.stm_capacity + self.cfg.batch + 1
        self.stm_x = torch.zeros(slots, *self.in_shape, device=self.ctx.device)
        self.stm_y = torch.zeros(slots, dtype=torch.long, device=self.ctx.device)

    def _new_expert(self) -> Expert:
        k = len(self.experts) - 1   # real experts so far
        if k + 1 > self.cfg.max_experts:
            raise RuntimeError(
                f"CN-DPM would create expert {k + 1}, more than max_experts = {self.cfg.max_experts}: new experts "
                f"are too likely, so log_alpha = {self.cfg.log_alpha} is too large for this benchmark's NLL scale "
                "(lower log_alpha, or raise classifier_chill / max_experts)")
        return Expert(self.cfg, self.in_shape, self.ctx.n_classes, max(k, 0), self.ctx.device)

    @property
    def n_experts(self) -> int:
        return max(len(self.experts) - 1, 0)

    # -------------------------------------------------------------- likelihoods

    def collect(self, x: torch.Tensor, experts: list[Expert]):
        """VAE NLL [B, len(experts)] and log p(y | x) [B, len(experts), C] of the given experts, in order;
        `experts` is expert 0 and/or a prefix of the real experts (each reads the previous one's features)."""
        nlls, logps = [], []
        prev_g = prev_d = None
        for e in experts:
            nll, feats_g = vae_nll(e.g, x, None if e is self.experts[0] else prev_g, self.cfg.z_samples)
            logp, feats_d = e.d(x, None if e is self.experts[0] else prev_d)
            if e is not self.experts[0]:
                prev_g, prev_d = feats_g, feats_d
            nlls.append(nll)
            logps.append(logp)
        return torch.stack(nlls, 1), torch.stack(logps, 1)

    # -------------------------------------------------------------- wake

    def observe(self, x, y, x_raw):
        if not self.experts:
            self._setup(x)
        cfg = self.cfg
        experts = list(self.experts)
        vae, logp = self.collect(x, experts)                                    # [B, 1+K], [B, 1+K, C]
        cls = chilled_nll(logp.flatten(0, 1), y.repeat_interleave(len(experts)),
                          cfg.classifier_chill).view(len(y), len(experts))
        nll = vae + cls
        with torch.no_grad():
            nl_joint = nll - self.log_counts
            to_stm = nl_joint.argmin(1) == 0
            resp = torch.exp(nl_joint.min(1, keepdim=True).values - nl_joint)
            resp[:, 0] = 0
            resp = resp / (resp.sum(1, keepdim=True) + 1e-7)
            usage = resp.sum(0)
            self.log_counts = torch.logaddexp(self.log_counts, usage.log())   # N_k += usage (N_0: + 0)
        loss = (nll * resp * (~to_stm).unsqueeze(1)).sum()
        if len(experts) > 1:
            for e in experts[1:]:
                e.opt_g.zero_grad()
                e.opt_d.zero_grad()
            loss.backward()
            for k, e in enumerate(experts[1:], start=1):
                stepped = usage[k] > cfg.update_min_usage
                e.opt_g.step(cfg.clip, stepped)
                e.opt_d.step(cfg.clip, stepped)
        self._to_stm(x, y, to_stm)
        return loss.detach()

    def _to_stm(self, x, y, to_stm) -> None:
        """Append the STM-bound samples without a host sync: each goes to slot stm_n + its rank among them, the
        others to the spare last slot (overwritten, never read); sleep once the STM holds stm_capacity samples."""
        spare = len(self.stm_y) - 1
        slot = torch.where(to_stm, self.stm_n + to_stm.long().cumsum(0) - 1, spare)
        self.stm_x.index_copy_(0, slot, x)
        self.stm_y.index_copy_(0, slot, y)
        self.stm_n += to_stm.sum()
        self._stm_bound += len(y)
        if self._stm_bound >= self.cfg.stm_capacity:
            n = int(self.stm_n)   # the only host sync, and only when a sleep may be due
            self._stm_bound = n
            if n >= self.cfg.stm_capacity:
                self.sleep(n)

    # -------------------------------------------------------------- sleep

    def sleep(self, n: int) -> None:
        """Train a new expert on the n STM samples (VAE, then classifier), register it with N = n + 1, empty the STM."""
        cfg = self.cfg
        x, y = self.stm_x[:n].clone(), self.stm_y[:n].clone()
        expert = self._new_expert()
        earlier = list(self.experts)[1:]
        with torch.no_grad():   # the earlier experts are frozen during sleep: their features of the STM once
            feats_g, feats_d = self._features(x, earlier)
        for steps, opt, part in ((cfg.sleep_steps_vae, expert.opt_g, "g"), (cfg.sleep_steps_cls, expert.opt_d, "d")):
            for _ in range(steps):
                idx = torch.randint(0, n, (cfg.sleep_batch,), device=x.device)
                xb, yb = x[idx], y[idx]
                if part == "g":
                    loss = vae_nll(expert.g, xb, _take(feats_g, idx), cfg.z_samples)[0].mean()
                else:
                    loss = F.nll_loss(expert.d(xb, _take(feats_d, idx))[0], yb)
                opt.zero_grad()
                loss.backward()
                # the explicit L2 term wd * sum ||theta||^2 of the loss, added as its gradient 2 wd theta
                opt.grad.add_(opt.params, alpha=2 * cfg.weight_decay)
                opt.step(cfg.clip)
        expert.opt_g.lr.mul_(cfg.lr_decay)
        expert.opt_d.lr.mul_(cfg.lr_decay)
        self.experts.append(expert)
        self.log_counts = torch.cat([self.log_counts, self.log_counts.new_tensor([math.log(n + 1)])])
        self.stm_n.zero_()
        self._stm_bound = 0

    def _features(self, x, earlier: list[Expert], chunk: int = 256):
        """The last earlier expert's detached concatenated features (VAE encoder, classifier) of x, or None."""
        if not earlier:
            return None, None
        out_g, out_d = [], []
        for lo in range(0, len(x), chunk):
            xb, prev_g, prev_d = x[lo:lo + chunk], None, None
            for e in earlier:
                prev_g = e.g.encode(xb, prev_g)[2]
                prev_d = e.d(xb, prev_d)[1]
            out_g.append(prev_g)
            out_d.append(prev_d)
        return [torch.cat(f) for f in zip(*out_g)], [torch.cat(f) for f in zip(*out_d)]

    # -------------------------------------------------------------- test time

    @torch.no_grad()
    def predict(self, x, chunk: int = 256):
        """log p(x, y = c) of the mixture over the existing experts (expert 0 excluded), unchilled classifiers."""
        if self.n_experts == 0:
            return torch.zeros(len(x), self.ctx.n_classes, device=x.device)
        log_prior = torch.log_softmax(self.log_counts[1:], 0)
        out = []
        for lo in range(0, len(x), chunk):
            vae, logp = self.collect(x[lo:lo + chunk], list(self.experts)[1:])
            out.append(torch.logsumexp(log_prior[None, :, None] - vae.unsqueeze(2) + logp, 1))
        return torch.cat(out)

    @torch.no_grad()
    def features(self, x, chunk: int = 256):
        """The classifier features `predict` reads: the last expert's penultimate layer, which holds every earlier
        expert's beside its own (lateral connections), for the report's t-SNE and the loop's collapse check."""
        return self._features(x, list(self.experts)[1:], chunk)[1][-1]

    def finish(self) -> None:
        if self.n_experts == 0:   # the mixture would predict class 0 for everything: a number that means nothing
            raise NoExpertError(f"CN-DPM made no expert over the whole stream: its short-term memory never held "
                                f"stm_capacity = {self.cfg.stm_capacity} samples; lower stm_capacity (or raise "
                                "log_alpha) for this stream")

    def extra_metrics(self) -> dict:
        return {"experts": self.n_experts}

    # -------------------------------------------------------------- checkpoints

    def load_state_dict(self, state: dict) -> None:
        """Rebuild as many experts as the saved state holds, then restore every tensor (and the Adam states)."""
        n = len({key.split(".")[0] for key in state["experts"]})
        if n and not self.experts:
            self._setup(state["stm_x"][:1].to(self.ctx.device))
        while len(self.experts) < n:
            self.experts.append(self._new_expert())
        super().load_state_dict(state)
        self._stm_bound = int(self.stm_n)


def _take(feats, idx):
    return None if feats is None else [f[idx] for f in feats]
