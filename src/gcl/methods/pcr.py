"""PCR: Proxy-based Contrastive Replay (Lin, Zhang, Zhao, Xu, Lin, Wang, "PCR: Proxy-based Contrastive Replay for
Online Class-Incremental Continual Learning", CVPR 2023; the authors' code: github.com/FelixHuiweiLin/PCR,
agents/pcr.py, utils/loss.py and models/resnet.py).

The classifier is a cosine head whose class weights are the proxies: scores = cos(f(x), w_c) / temperature. Each
step, once the buffer holds samples, the stream batch x and a replayed batch b_x (random, `replay_batch`) are each
taken with a second view made by PCR's own augmentation (`view`: a random resized crop, flip, colour jitter and
grey-scale of every image), and with z = the L2-normalised features of [b_x; view(b_x); x; view(x)] (replayed
first), y their labels, and p_i = the normalised proxy of y_i:

    s_ij = <z_i, p_j> / temperature                      anchors against the proxies of the batch's labels
    L    = - mean_i [ s_i,y_i - log sum_j exp(s_ij) ]      j over the batch's samples, duplicates included

that is, a cross-entropy over the proxies of the classes present in the batch, each weighted by its count there
(`proxy_contrastive_loss`); classes absent from the batch get no gradient. The stream batch and the replayed one
pass through the network separately (stream first). No cross-entropy over all classes: the reference computes one
and multiplies it by 0. Before the buffer holds samples there is no loss and no update. Evaluation: the cosine
head's argmax. No task boundaries.

The departures from the reference are in docs/methods.md ("pcr").
"""
from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field
from torch import nn
from torchvision.transforms import v2

from gcl.methods.base import Method, MethodContext, ReplaySettings, register

EPS = 1e-6   # added to a norm before dividing by it (the reference's, in the loss)


def proxy_contrastive_loss(features: torch.Tensor, labels: torch.Tensor, proxies: torch.Tensor,
                           temperature: float) -> torch.Tensor:
    """PCR's loss: each normalised feature against the normalised proxies of every sample's label in the batch (so the
    proxies of the batch's classes, as often as each appears), a softmax over them, the mean log-probability of the
    positives (the same class), negated and averaged over the anchors (the reference's SupConLoss, mode 'proxy')."""
    z = features / (features.norm(dim=1, keepdim=True) + EPS)
    p = proxies[labels]
    p = p / (p.norm(dim=1, keepdim=True) + EPS)
    scores = z @ p.t() / temperature
    scores = scores - scores.max(dim=1, keepdim=True).values.detach()     # for stability, as the reference
    log_prob = scores - torch.log(torch.exp(scores).sum(dim=1, keepdim=True))
    positives = (labels[:, None] == labels[None, :]).to(scores.dtype)
    return -((positives * log_prob).sum(dim=1) / positives.sum(dim=1)).mean()


def simclr_view(size: tuple[int, int]) -> v2.Compose:
    """PCR's augmentation of one uint8 image (its transforms_aug for CIFAR): random resized crop (scale 0.2-1),
    horizontal flip, colour jitter (0.4, 0.4, 0.4, 0.1) with probability 0.8, grey-scale with probability 0.2."""
    return v2.Compose([
        v2.RandomResizedCrop(size=size, scale=(0.2, 1.0), antialias=True),
        v2.RandomHorizontalFlip(),
        v2.RandomApply([v2.ColorJitter(0.4, 0.4, 0.4, 0.1)], p=0.8),
        v2.RandomGrayscale(p=0.2),
    ])


class PCRSettings(ReplaySettings):
    head: Literal["cosine"] = Field("cosine", description="the classifier: cosine (its class weights are the proxies; "
                                    "PCR's only head)")
    head_scale: float = Field(1 / 0.09, gt=0, description="the cosine head's scale, 1 / temperature (the reference's "
                              "scores are cosines / 0.09); evaluation takes its argmax")
    temperature: float = Field(0.09, gt=0, description="the proxy-contrastive loss's temperature (the reference's "
                               "pcr_temp, 0.09)")


@register
class PCR(Method):
    trains_alone = "its views are drawn image by image by torchvision's transforms from the global generator"
    name = "pcr"
    summary = ("PCR: a contrastive loss of the stream and replayed batches, each with an augmented view, against the "
               "cosine head's class proxies of the classes in the batch (Lin et al., CVPR 2023)")
    uses_buffer = True
    heads = ("cosine",)
    Settings = PCRSettings

    def __init__(self, net: nn.Module, cfg: PCRSettings, ctx: MethodContext):
        super().__init__(net, cfg, ctx)
        if ctx.plain_transform is None:
            raise ValueError("pcr needs the benchmark's plain (test) transform to normalise its augmented views")
        self._view: v2.Compose | None = None

    def view(self, x_raw: torch.Tensor) -> torch.Tensor:
        """PCR's second view of a uint8 batch, drawn afresh per image (torch's global generator, which the loop seeds
        and checkpoints), normalised as the network's inputs are."""
        if x_raw.dim() != 4:
            raise ValueError(f"pcr's augmentation needs images (batch, channels, H, W); this benchmark gives "
                             f"{tuple(x_raw.shape[1:])}")
        if self._view is None:
            self._view = simclr_view(tuple(x_raw.shape[-2:]))
        return self.ctx.plain_transform(torch.stack([self._view(image) for image in x_raw]))

    def observe(self, x, y, x_raw):
        if self.buffer.is_empty():           # the reference's loss is 0 x CE then: no update
            self.buffer.add(examples=x_raw, labels=y)
            return torch.zeros((), device=x.device)
        stream = self.net.features(torch.cat([x, self.view(x_raw)]))
        buf_raw, buf_y = self.buffer.sample(self.cfg.replay_batch, "examples", "labels")
        replayed = self.net.features(torch.cat([self.ctx.train_transform(buf_raw), self.view(buf_raw)]))
        labels = torch.cat([buf_y, buf_y, y, y])
        loss = proxy_contrastive_loss(torch.cat([replayed, stream]), labels, self.net.classifier.weight,
                                      self.cfg.temperature)
        loss = self.sgd_step(loss)
        self.buffer.add(examples=x_raw, labels=y)
        return loss
