"""GSS (Aljundi et al. 2019), the greedy variant as the reference framework (mammoth) implements it.

Training is ER's (stream batch + a random buffer batch, one cross-entropy, `batch_num` steps per
stream batch); what differs is which samples the buffer keeps. A sample's score is
    c = 1 + max_j cos(g, g_j),
g its loss gradient and g_j the per-sample gradients of a random subset of `gss_minibatch` buffer
samples: a low score means a gradient unlike anything stored. Then, per stream batch:
- while the buffer has room, samples fill it in order, each stored with the score of the whole
  batch (its mean gradient), or 0.1 while the buffer is still empty;
- once it is full, and only if the batch's own score is below 1 (its gradient points away from
  every sampled buffer gradient), each remaining sample picks a candidate slot i with probability
  proportional to the stored scores (redundant samples are picked more often) and takes it when a
  uniform draw r < C_i / (C_i + c): the less similar the newcomer, the likelier it gets in.
The method is never told of a task boundary; its buffer stays at capacity once filled.
"""
from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field
from torch.func import functional_call, grad, vmap

from gcl.core.backbones import MLP, inputs_as_given
from gcl.core.buffer import ReservoirBuffer, to_device
from gcl.data.transforms import to_unit_float
from gcl.methods.base import Method, ReplaySettings, register

EMPTY_BUFFER_SCORE = 0.1   # the reference's score for samples that arrive while the buffer is empty


def _norm(blocks: list[torch.Tensor], dim: int) -> torch.Tensor:
    """The norm of vectors split into blocks along `dim`, clamped as F.normalize does, so that a zero
    gradient has cosine 0 with everything."""
    return sum(torch.linalg.vector_norm(b, dim=dim) ** 2 for b in blocks).sqrt().clamp_min(1e-12)


def gradient_cosines(new: list[torch.Tensor], ref: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Cosine similarities of gradients given per parameter: new[k] is (B, n_k), ref[k] is (R, n_k).

    Returns (cos(mean of the new gradients, ref_j) for each j: (R,), cos(new_i, ref_j): (B, R)).
    The mean of the new gradients is the gradient of the batch's mean loss. Dot products and norms
    are summed parameter by parameter, so the (N, n_params) gradient matrix is never concatenated.
    """
    cross = sum(n @ r.T for n, r in zip(new, ref))            # (B, R)
    new_norm, ref_norm = _norm(new, 1), _norm(ref, 1)            # (B,), (R,)
    mean_norm = _norm([n.mean(0) for n in new], 0)
    sample_cos = cross / (new_norm[:, None] * ref_norm[None, :])
    batch_cos = cross.mean(0) / (mean_norm * ref_norm)    # <mean_i n_i, r> = mean_i <n_i, r>
    return batch_cos, sample_cos


def mlp_gradient_factors(net: MLP, x: torch.Tensor, y: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each sample's loss gradient, in factors, for a network of Linear and ReLU layers only: per Linear layer,
    (g, a) with g (N, out) the gradient of sample i's loss with respect to the layer's output and a (N, in) its
    input. Sample i's weight gradient is the outer product g_i a_i^T, its bias gradient g_i; one batched backward
    gives them all."""
    linears = [m for m in net.modules() if isinstance(m, torch.nn.Linear)]
    if any(m.bias is None for m in linears):
        raise ValueError("mlp_gradient_factors expects every Linear layer to have a bias")
    seen = {}
    hooks = [m.register_forward_hook(lambda mod, args, out: seen.__setitem__(mod, (args[0], out))) for m in linears]
    try:
        with torch.enable_grad(), torch.autocast(x.device.type, enabled=False):
            loss = F.cross_entropy(net(x), y, reduction="sum")   # rows independent: d loss / d out_i is sample i's
            out_grads = torch.autograd.grad(loss, [seen[m][1] for m in linears])
    finally:
        for h in hooks:
            h.remove()
    return [(g, seen[m][0].detach()) for m, g in zip(linears, out_grads)]


def factored_gradient_cosines(factors: list[tuple[torch.Tensor, torch.Tensor]], n_new: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`gradient_cosines` of the first n_new samples against the others, from the Linear layers' factors (g, a)
    of `mlp_gradient_factors`, without forming a per-sample gradient. For outer products,
    <g_i a_i^T, g_j a_j^T> = (g_i . g_j)(a_i . a_j), and a bias adds g_i . g_j: every dot product and norm is
    a product of two small Gram matrices, so a step costs O(N^2 width) instead of O(N params). The same values as
    the explicit gradients' up to float rounding (tested)."""
    cross = new_sq = ref_sq = mean_sq = 0.0
    for g, a in factors:
        gg, aa = g @ g.T, a @ a.T + 1.0                    # + 1: the bias, whose "input" is the constant 1
        prod = gg * aa                                     # <grad_i, grad_j> of this layer's weight and bias
        cross = cross + prod[:n_new, n_new:]
        sq = prod.diagonal()
        new_sq, ref_sq = new_sq + sq[:n_new], ref_sq + sq[n_new:]
        mean_sq = mean_sq + prod[:n_new, :n_new].sum() / n_new ** 2   # ||mean_i grad_i||^2
    # clamped as F.normalize does: a zero gradient has cosine 0 with everything
    new_norm, ref_norm = new_sq.sqrt().clamp_min(1e-12), ref_sq.sqrt().clamp_min(1e-12)
    mean_norm = mean_sq.sqrt().clamp_min(1e-12)
    sample_cos = cross / (new_norm[:, None] * ref_norm[None, :])
    batch_cos = cross.mean(0) / (mean_norm * ref_norm)
    return batch_cos, sample_cos


class GSSBuffer(ReservoirBuffer):
    """Examples, labels and one score per slot, filled greedily instead of by reservoir sampling.

    Storage, `sample`, `get` and `len` are the reservoir buffer's; only insertion differs. All random
    draws come from the run's CPU generator and everything else stays on the device (no host sync).
    """

    def add(self, examples: torch.Tensor, labels: torch.Tensor,
            batch_score: torch.Tensor, sample_scores: torch.Tensor) -> None:
        """Offer a batch: free slots first (in order), then score-weighted replacement for the rest."""
        batch = examples.shape[0]
        values = {"examples": examples, "labels": labels}
        if not self.fields:
            self._allocate({**values, "scores": sample_scores})
        filled = len(self)
        n_fill = min(batch, self.capacity - filled)
        if n_fill > 0:   # room left: fill the next slots in order, scored by the whole batch
            for name, v in values.items():
                self.fields[name][filled:filled + n_fill] = v[:n_fill].detach().to(self.fields[name].dtype)
            self.fields["scores"][filled:filled + n_fill] = batch_score.detach()
        self.seen += batch
        if n_fill < batch:
            self._replace({**values, "scores": sample_scores}, batch_score, n_fill)

    def _replace(self, values: dict[str, torch.Tensor], batch_score: torch.Tensor, start: int) -> None:
        """Score-weighted replacement for batch rows start.. of a full buffer, all rows at once.

        Candidates and draws are taken against the scores as they stand before this batch (the
        reference goes sample by sample); where several accepted rows chose the same slot the
        later one wins, as it would sequentially. With a batch of at most a few dozen rows against
        hundreds of slots such collisions are rare.
        """
        n = values["examples"].shape[0] - start
        scores = self.fields["scores"]
        u, r = to_device(torch.rand(2, n, generator=self.generator), self.device)
        cdf = torch.cumsum(scores, 0)
        # inverse-CDF draw: slot i with probability scores[i] / sum(scores); the clamp guards rounding
        cand = torch.searchsorted(cdf, u * cdf[-1], right=True).clamp_max(self.capacity - 1)
        new_scores = values["scores"][start:].detach()
        old_scores = scores[cand]
        accept = (batch_score < 1) & (r * (old_scores + new_scores) < old_scores)   # r < C_i / (C_i + c)
        # for every candidate slot, the last accepted batch row that claims it (-1: none), so that
        # duplicate slots all write the same value and the result does not depend on write order
        rows = torch.arange(start, start + n, device=self.device)
        winner = torch.full((self.capacity,), -1, dtype=torch.long, device=self.device)
        winner.scatter_reduce_(0, cand, torch.where(accept, rows, -1), reduce="amax")
        win = winner[cand]
        take, src = win >= 0, win.clamp_min(0)
        for name, v in values.items():
            field = self.fields[name]
            keep_new = take.view(-1, *([1] * (field.dim() - 1)))
            field[cand] = torch.where(keep_new, v.detach()[src].to(field.dtype), field[cand])


class GSSSettings(ReplaySettings):
    score_input: Literal["raw", "plain"] = Field(
        "raw", description="images whose gradients are scored: raw ([0, 1] pixels, not normalised: the reference "
                           "framework) or plain (normalised, not augmented)")
    gss_minibatch: int = Field(gt=0, description="buffer samples whose gradients score a newcomer")
    batch_num: int = Field(1, gt=0, description="SGD steps per stream batch, each with a fresh buffer batch")


@register
class GSS(Method):
    trains_alone = "its buffer selects samples by their gradients' similarity, per-sample gradients of one network"
    name = "gss"
    summary = "Gradient-based Sample Selection (greedy): keep samples whose gradients differ from the buffer's"
    uses_buffer = True
    Settings = GSSSettings

    def __init__(self, net, cfg, ctx):
        super().__init__(net, cfg, ctx)
        self.buffer = GSSBuffer(cfg.buffer, ctx.device, ctx.generator)
        # the scored images are never augmented; the reference scores them un-normalised as well
        self.plain = to_unit_float if cfg.score_input == "raw" else (ctx.plain_transform or ctx.train_transform)

        def sample_loss(params, x, y):
            return F.cross_entropy(functional_call(net, params, (x[None],)), y[None])

        # per-sample loss gradients in one vectorised call (no Python loop over samples)
        self._per_sample_grads = vmap(grad(sample_loss), in_dims=(None, 0, 0))

    def per_sample_grads(self, x: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
        """Each sample's loss gradient, one (N, n_k) tensor per parameter. In eval mode, as the reference
        does: BatchNorm then uses its running statistics and a single sample is a valid batch. In fp32
        outside any bf16 autocast (whose casts do not pass through vmap's batch norm), with the input's
        layout left as it is (vmap cannot make a per-sample input channels_last)."""
        was_training = self.net.training
        self.net.eval()
        params = {k: p.detach() for k, p in self.net.named_parameters()}
        with torch.autocast(x.device.type, enabled=False), inputs_as_given(self.net):
            grads = self._per_sample_grads(params, x.float(), y)
        self.net.train(was_training)
        return [g.flatten(1) for g in grads.values()]

    def score_cosines(self, x: torch.Tensor, y: torch.Tensor, n_new: int) -> tuple[torch.Tensor, torch.Tensor]:
        """`gradient_cosines` of the first n_new samples' loss gradients against the others'. On the MLP (no
        BatchNorm, so eval mode changes nothing) from the Linear layers' gradient factors, faster than per-sample
        gradients (docs/performance.md) and the same cosines up to float rounding; elsewhere from vmap's
        per-sample gradients."""
        if isinstance(self.net, MLP):
            return factored_gradient_cosines(mlp_gradient_factors(self.net, x.float(), y), n_new)
        grads = self.per_sample_grads(x, y)
        return gradient_cosines([g[:n_new] for g in grads], [g[n_new:] for g in grads])

    def scores(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(score of the whole batch, score of each sample): 1 + max cosine similarity of the gradient
        to the gradients of a random subset of the buffer. `x` is non-augmented, and so are the buffer
        samples it is compared with (the reference scores clean images)."""
        if self.buffer.is_empty():
            return (torch.tensor(EMPTY_BUFFER_SCORE, device=x.device),
                    torch.full((len(x),), EMPTY_BUFFER_SCORE, device=x.device))
        buf_raw, buf_y = self.buffer.sample(self.cfg.gss_minibatch, "examples", "labels")
        batch_cos, sample_cos = self.score_cosines(torch.cat([x, self.plain(buf_raw)]), torch.cat([y, buf_y]), len(x))
        return batch_cos.amax() + 1, sample_cos.amax(1) + 1

    def observe(self, x, y, x_raw):
        for _ in range(self.cfg.batch_num):
            inputs, labels = x, y
            if not self.buffer.is_empty():
                buf_x, buf_y = self.replay_batch(self.cfg.replay_batch, "labels")
                inputs, labels = torch.cat([x, buf_x]), torch.cat([y, buf_y])
            loss = self.sgd_step(F.cross_entropy(self.net(inputs), labels))
        # scored with the updated network, as the reference does (it trains, then adds)
        batch_score, sample_scores = self.scores(self.plain(x_raw), y)
        self.buffer.add(examples=x_raw, labels=y, batch_score=batch_score, sample_scores=sample_scores)
        return loss
