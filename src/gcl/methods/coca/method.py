"""CoCa, Complementary Calibration (paper Section III): experience replay, collaborative knowledge
distillation (relation calibration) and collaborative self-supervision (feature calibration).

    L = L_base + lambda1 * L_CKD + lambda2 * (L_PT + L_SCL)                       (paper Eq. 15)

One step, structured as the authors' code (DER++ with the distillation target replaced by o*):
- L_base (Eq. 2): the mean cross-entropy of the stream batch plus beta times the mean cross-entropy
  of a buffer batch b2 (labels): a sum of two means, as the paper and the authors' code write it
  (beta = 1 is Eq. 2; the authors' best arguments use 0.5 or 1.0). With every switch off this class
  trains on L_base alone, which is not ER (ER takes one mean over the concatenated batch); Table 3's
  "ER" row is the ER method's own runs.
- L_CKD: on an independent buffer batch b1 (examples and the logits o_hat stored when they entered
  the buffer, as in DER): MSE between the current logits o and the detached target
  o* = gamma * (1 - omega) (I - omega S_hat)^-1 o + (1 - gamma) * o_hat               (Eq. 4, 10, 11)
  where S_hat is the row-normalised affinity of b1's L2-normalised embeddings.
- L_PT: an auxiliary head predicts which geometric transformation (gcl.methods.coca.pretext) was applied;
  L_SCL: supervised contrastive loss (Khosla et al. 2020) over two views (original, transformed)
  of the projector's normalised embeddings. Both run on the stream batch concatenated with b2, and
  the transformed view is shared by both (the authors' code; one transformation per sample).
- One forward per role with BatchNorm: stream, b2, b1 and the transformed view each alone, so each
  role keeps its own batch statistics, as the DER++ implementations do. Without BatchNorm in the
  backbone (the MLP) the roles are one forward of their concatenation, the same function of each
  input in fewer operations.

Relation to DER++ (L = CE_s + alpha * MSE(b1) + beta * CE(b2)): lambda1 plays alpha's role and beta
is DER++'s beta; with ckd's gamma = 0 and pt, scl off, CoCa is DER++ (tested). The MNIST-360 and
seq-MNIST settings are tuned on a validation split (params.yaml records the grid).

Settings and where each default comes from:
- omega = 0.1: paper (Section IV-B) and authors' code agree.
- gamma = 0.1: paper; the authors' code uses 0.01 (run both: variant coca-g001).
- lambda1 = 0.5: the code reuses DER++'s alpha per benchmark; 0.5 is DER++'s MNIST-360 alpha.
- lambda2 = 0.3: the code weights L_PT and L_SCL 0.3 each (the paper has one lambda2 for both).
- tau = 0.07: code (Khosla et al.'s default); the paper grid-searches it without giving a value.
- affinity = "paper": S(i, i) = 0 and the row softmax runs over k != i (Eq. 6-7), i.e. a zero
  diagonal; "code": softmax(Z Z^T - affinity_c * I), the authors' code, with affinity_c = 1.0
  (general-continual copy; 0.1 in the boundary variant): the diagonal keeps a small weight.
- ckd_embedding = "projector": the code's affinity uses the projector's normalised output; the
  paper says "normalized feature embeddings obtained by the feature extractor" ("backbone").
  With scl off nothing trains the projector, so the ckd-only row then measures similarity through a
  fixed random projection of the features.
- pretext = "paper": 16 proxy classes (4 rotations x {identity, scale 0.67, aspect 0.67,
  aspect 1.33}), one random transformation per sample, as the paper lists them and as the code's
  boundary variant counts them; "rotation": the general-continual code's 4 rotations.
- Heads (dropped at test time: `predict` uses the network only; the loop never sees the heads):
  built from backbone.feat_dim by the authors' two recipes, chosen by the backbone's kind (its
  `head_style`, so a narrowed network of a dry run keeps its kind's heads). The MNIST MLP (100-d), as the
  authors' MNIST code: Linear(feat, feat), [BatchNorm1d], ReLU,
  Linear(feat, out), Xavier-uniform weights and zero biases, projection 32-d. ResNet-18 (512-d): feat -> feat (BN,
  ReLU) -> feat (BN, ReLU) -> out, projection 64-d. The paper's text says
  "three hidden layers"; the code's sizes are used.
- head_norm = "auto": the heads have BatchNorm when the backbone has it (ResNet-18, as the code) and
  none on the MLP (a departure from the authors' MNIST code, which has it). Reason: MNIST-360
  trains at stream batches 1-4, so a head's BatchNorm normalises the stream sample plus the few
  replayed ones of the first steps (2-17 samples); on the bundled stream at batch 1 (beta 16, lr
  0.2/17) that diverged in most seeds within the first steps, while the heads without it train (tests/
  test_coca.py). "batchnorm" / "none" force either. A batch of one sample passes a BatchNorm head in
  eval mode (its running statistics), which PyTorch's training mode refuses.
- ckd / pt / scl: the ablation switches of Table 3; all on by default (the full method).

General continual: no task boundary is used or accepted (needs_boundaries stays False).
"""
from __future__ import annotations

from functools import lru_cache
from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from gcl.core.seeds import normalises_batches
from gcl.methods.base import Method, ReplaySettings, register
from gcl.methods.coca.pretext import apply_pretext, n_pretext_classes, pretext_labels

AFFINITIES = ("paper", "code")


# ---------------------------------------------------------------------------- relation calibration

@lru_cache(maxsize=64)
def _eye(n: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """The identity of size n, built once per size (a step's batches take a few sizes); never written to."""
    return torch.eye(n, dtype=dtype, device=device)


def affinity(z: torch.Tensor, mode: str = "paper", c: float = 1.0) -> torch.Tensor:
    """S_hat: the row-stochastic similarity of the normalised embeddings z (N, d) of one batch (or (S, N, d):
    each seed's batch of stacked seeds, gcl.core.seeds).

    "paper": zero diagonal, softmax over the other samples (Eq. 6-7). A finite fill instead of -inf
    keeps a lone sample (N = 1) well defined: it then propagates to itself (S_hat = [1]).
    "code": softmax(z z^T - c I).
    """
    sim = z @ z.transpose(-2, -1)
    eye = _eye(z.shape[-2], torch.bool, z.device)
    if mode == "paper":
        sim = sim.masked_fill(eye, -1e9)
    elif mode == "code":
        sim = sim - c * eye
    else:
        raise ValueError(f"unknown affinity {mode!r}; known: {AFFINITIES}")
    return sim.softmax(dim=-1)


def propagate(s_hat: torch.Tensor, o: torch.Tensor, omega: float) -> torch.Tensor:
    """Closed-form label propagation Q = (1 - omega) (I - omega S_hat)^-1 o (Eq. 10), as a linear solve.

    S_hat is row-stochastic, so I - omega S_hat is strictly diagonally dominant, and invertible, for
    omega < 1: `solve_ex` skips `solve`'s singularity check, which would wait for the GPU at every step.
    At omega = 1, I - S_hat is singular (S_hat's rows sum to 1); Q is then taken as zero, the paper's reading of
    its Figure 4's point (the factor 1 - omega vanishes and o* = (1 - gamma) o_hat), and nothing is solved. That
    is not the limit omega -> 1 from below, which is the ergodic average 1 pi^T o (pi: S_hat's stationary
    distribution; docs/methods.md).
    Solved in at least fp32 (under bf16 autocast the inputs may arrive in bf16, which the solver does not take).
    """
    dtype = torch.promote_types(torch.promote_types(s_hat.dtype, o.dtype), torch.float32)
    s_hat, o = s_hat.to(dtype), o.to(dtype)
    if omega == 1.0:
        return torch.zeros_like(o)
    eye = _eye(s_hat.shape[-1], s_hat.dtype, s_hat.device)       # a stack (S, N, N) solves each seed's system
    return (1.0 - omega) * torch.linalg.solve_ex(eye - omega * s_hat, o).result


def collaborative_target(o: torch.Tensor, o_hat: torch.Tensor, z: torch.Tensor, omega: float, gamma: float,
                         mode: str = "paper", c: float = 1.0) -> torch.Tensor:
    """o* = gamma * Q + (1 - gamma) * o_hat (Eq. 11); differentiable: callers detach it."""
    return gamma * propagate(affinity(z, mode, c), o, omega) + (1.0 - gamma) * o_hat


def ckd_loss(o: torch.Tensor, o_hat: torch.Tensor, z: torch.Tensor, omega: float, gamma: float,
             mode: str = "paper", c: float = 1.0) -> torch.Tensor:
    """L_CKD = MSE(o, stopgrad(o*)) (Eq. 4); gamma = 0 gives DER's loss (Eq. 3)."""
    with torch.no_grad():
        target = collaborative_target(o, o_hat, z, omega, gamma, mode, c)
    return F.mse_loss(o, target)


# ---------------------------------------------------------------------------- feature calibration

def supcon_loss(z: torch.Tensor, labels: torch.Tensor, tau: float) -> torch.Tensor:
    """Supervised contrastive loss (Khosla et al. 2020, L_out; paper Eq. 13) of normalised embeddings z.

    For each anchor i: -1/|P(i)| sum_{p in P(i)} log(exp(z_i.z_p / tau) / sum_{a != i} exp(z_i.z_a / tau)),
    P(i) = the other samples of i's class; averaged over anchors that have a positive. Eq. 13 as
    printed omits the 1/|P(i)| (identical when every anchor has one positive); Khosla's and the
    authors' code have it. Stacked seeds' z (S, N, d) and labels (S, N) give each seed's loss (S,).
    """
    eye = _eye(z.shape[-2], torch.bool, z.device)
    logits = (z @ z.transpose(-2, -1) / tau).masked_fill(eye, float("-inf"))
    log_prob = logits - torch.logsumexp(logits, dim=-1, keepdim=True)
    positive = (labels.unsqueeze(-1) == labels.unsqueeze(-2)) & ~eye
    n_pos = positive.sum(-1)
    # where(...) rather than multiplying by the mask: the diagonal's log_prob is -inf
    per_anchor = -torch.where(positive, log_prob, 0.0).sum(-1) / n_pos.clamp(min=1)
    has_pos = (n_pos > 0).to(z.dtype)
    return (per_anchor * has_pos).sum(-1) / has_pos.sum(-1).clamp(min=1.0)


def replay_batches(method, x: torch.Tensor, y: torch.Tensor):
    """A CoCa step's buffer batches, drawn in this order: b2 (images, labels), then with CKD b1 (images, stored
    logits); and the stream batch joined with b2: (buf_x, buf_y, b1, inputs, labels), the first three None while
    the buffer is empty (b1 also without CKD)."""
    buf_x = buf_y = b1 = None
    if not method.buffer.is_empty():
        buf_x, buf_y = method.replay_batch(method.cfg.replay_batch, "labels")        # b2
        if method.ckd:
            b1 = method.replay_batch(method.cfg.replay_batch, "logits")              # b1
    inputs = x if buf_x is None else method.seeds.cat([x, buf_x])
    labels = y if buf_y is None else method.seeds.cat([y, buf_y])
    return buf_x, buf_y, b1, inputs, labels


def mlp_head(style: str, feat_dim: int, out_dim: int, batchnorm: bool = True) -> nn.Sequential:
    """The authors' head for a backbone of this `head_style` (see the module docstring), with or without BatchNorm."""
    norm = (lambda: [nn.BatchNorm1d(feat_dim)]) if batchnorm else list
    if style == "mlp":
        head = nn.Sequential(nn.Linear(feat_dim, feat_dim), *norm(), nn.ReLU(), nn.Linear(feat_dim, out_dim))
        for m in head:
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                nn.init.zeros_(m.bias)
        return head
    hidden = []
    for _ in range(2):
        hidden += [nn.Linear(feat_dim, feat_dim), *norm(), nn.ReLU()]
    return nn.Sequential(*hidden, nn.Linear(feat_dim, out_dim))


def head_output(head: nn.Module, feats: torch.Tensor, batchnorm: bool, batch_dim: int = 0) -> torch.Tensor:
    """A head's output; a single sample (a batch of one along `batch_dim`: 1 where a seed dimension comes first)
    passes with the head's BatchNorm in eval mode, since batch statistics of one sample are undefined (see the
    module docstring)."""
    if feats.shape[batch_dim] > 1 or not head.training or not batchnorm:
        return head(feats)
    head.eval()
    try:
        return head(feats)
    finally:
        head.train()


def projection_dim(style: str) -> int:
    return 32 if style == "mlp" else 64


# ---------------------------------------------------------------------------- the method

class CoCaSettings(ReplaySettings):
    """replay_batch is the size of both buffer batches, b1 (CKD) and b2 (L_base)."""

    ckd: bool = Field(True, description="collaborative knowledge distillation (Table 3 switch)")
    pt: bool = Field(True, description="pretext task on transformed views (Table 3 switch)")
    scl: bool = Field(True, description="supervised contrastive loss over two views (Table 3 switch)")
    lambda1: float = Field(0.5, ge=0, description="weight of L_CKD")
    lambda2: float = Field(0.3, ge=0, description="weight of L_PT + L_SCL")
    omega: float = Field(0.1, ge=0, le=1, description="propagation strength; at 1 the propagated logits are taken as "
                         "zero (the paper's Figure 4 reading: o* = (1 - gamma) o_hat), I - S being singular")
    gamma: float = Field(0.1, ge=0, le=1, description="share of the propagated logits Q in the target o*")
    tau: float = Field(0.07, gt=0, description="SupCon temperature")
    beta: float = Field(1.0, ge=0, description="weight of the replayed batch's cross-entropy in L_base (Eq. 2: 1)")
    pretext: Literal["paper", "rotation"] = Field("paper", description="16 transformations (paper) or 4 rotations")
    affinity: Literal["paper", "code"] = Field("paper", description="zero diagonal (Eq. 6-7) or softmax(ZZ^T - cI)")
    affinity_c: float = Field(1.0, ge=0, description="c of the 'code' affinity")
    ckd_embedding: Literal["projector", "backbone"] = Field("projector", description="embeddings of the affinity")
    head_norm: Literal["auto", "batchnorm", "none"] = Field(
        "auto", description="BatchNorm in the heads: auto = where the backbone has it (not on the MNIST MLP)")


@register
class CoCa(Method):
    name = "coca"
    capturable = True
    summary = "CoCa: L_base (Eq. 2) + collaborative distillation (CKD) + pretext task (PT) + supervised contrast (SCL)"
    uses_buffer = True
    Settings = CoCaSettings
    state_attrs = ("heads",)

    def __init__(self, net, cfg, ctx):
        super().__init__(net, cfg, ctx)
        self.ckd, self.pt, self.scl = cfg.ckd, cfg.pt, cfg.scl
        self._per_role_forward = normalises_batches(net)
        norm = cfg.head_norm
        self._heads_batchnorm = self._per_role_forward if norm == "auto" else norm == "batchnorm"
        feat_dim, style = net.feat_dim, net.head_style
        heads = nn.ModuleDict()
        if self.scl or (self.ckd and cfg.ckd_embedding == "projector"):
            heads["projector"] = mlp_head(style, feat_dim, projection_dim(style), self._heads_batchnorm)
        if self.pt:
            heads["pretext"] = mlp_head(style, feat_dim, n_pretext_classes(cfg.pretext), self._heads_batchnorm)
        # kept outside self.net, so evaluation (Method.predict -> self.net) cannot reach them
        self.heads = heads.to(ctx.device)
        self.params += list(heads.parameters())

    def _features(self, roles: list[torch.Tensor]) -> list[torch.Tensor]:
        """Backbone features of each role's batch. With BatchNorm (the image backbones) one forward per
        role, as ER (stream + b2) and DER (b1 alone) do: a shared forward would normalise each role with
        the others' batch statistics. Without it (the MLP) one forward of the concatenation is the same
        function of each input, in fewer, larger operations."""
        seeds = self.seeds
        if self._per_role_forward:
            return [self.net.features(x) for x in roles]
        return list(seeds.split(self.net.features(seeds.cat(roles)), [seeds.size(x) for x in roles]))

    def _head(self, name: str, feats: torch.Tensor) -> torch.Tensor:
        return head_output(self.heads[name], feats, self._heads_batchnorm, self.seeds.batch_dim)

    def _embed(self, feats: torch.Tensor) -> torch.Tensor:
        return F.normalize(self._head("projector", feats), dim=-1)

    def _pretext(self, inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One random transformation of each sample (drawn from its seed's generator): the views and their labels."""
        variant, count = self.cfg.pretext, self.seeds.size(inputs)
        labels = self.seeds.draw(lambda g: pretext_labels(count, variant, g, inputs.device))
        return self.seeds.per_sample(lambda images, y: apply_pretext(images, y, variant), inputs, labels), labels

    def observe(self, x, y, x_raw):
        cfg, seeds = self.cfg, self.seeds
        buf_x, buf_y, b1, inputs, labels = replay_batches(self, x, y)
        x_view = None
        if self.pt or self.scl:
            # one random transformation per sample of stream + b2, shared by the pretext task and SCL's view
            x_view, pt_labels = self._pretext(inputs)
        roles = [x] + [r for r in (buf_x, None if b1 is None else b1[0], x_view) if r is not None]
        f_x, *rest = self._features(roles)
        logits = self.net.classifier(f_x)
        loss = seeds.cross_entropy(logits, y)                               # L_base (Eq. 2): stream mean ...
        feats = f_x
        if buf_x is not None:
            f_b2 = rest.pop(0)
            loss = loss + cfg.beta * seeds.cross_entropy(self.net.classifier(f_b2), buf_y)   # ... + beta * buffer's
            feats = seeds.cat([f_x, f_b2])

        if b1 is not None:
            f_b1 = rest.pop(0)
            o = self.net.classifier(f_b1)
            with torch.no_grad():   # the target is detached: its embeddings need no graph
                z = self._embed(f_b1) if cfg.ckd_embedding == "projector" else F.normalize(f_b1, dim=-1)
                target = collaborative_target(o, b1[1], z, cfg.omega, cfg.gamma, cfg.affinity, cfg.affinity_c)
            loss = loss + cfg.lambda1 * seeds.mse(o, target)                # L_CKD (Eq. 4)
        if x_view is not None:
            f_view = rest.pop(0)
            css = 0.0
            if self.pt:
                css = css + seeds.cross_entropy(self._head("pretext", f_view), pt_labels)
            if self.scl:
                z = self._embed(seeds.cat([feats, f_view]))
                css = css + supcon_loss(z, seeds.cat([labels, labels]), cfg.tau)
            loss = loss + cfg.lambda2 * css

        loss = self.sgd_step(loss)
        fields = {"examples": x_raw, "labels": y}
        if self.ckd:
            fields["logits"] = logits.detach()   # o_hat: this step's pre-update outputs, as DER
        self.buffer.add(**fields)
        return loss
