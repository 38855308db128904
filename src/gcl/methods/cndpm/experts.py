"""CN-DPM's experts: the authors' VAE and classifier architectures (MNIST MLPs, CIFAR conv VAE and ResNet-10)
with lateral connections to earlier experts, an expert pairing the two with their optimisers, and the VAE's
negative ELBO with a hand-written reconstruction gradient."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from gcl.methods.cndpm.optim import Adam


class MlpVae(nn.Module):
    """The authors' MlpSharingVae: encoder in -> h -> h (lateral inputs), mu / log var heads; unshared decoder
    z -> base -> base -> in (sigmoid mean)."""

    def __init__(self, in_dim: int, z_dim: int, base: int, ext: int, n_prev: int):
        super().__init__()
        own, cat = (base if n_prev == 0 else ext), base + n_prev * ext
        self.enc1, self.enc2 = nn.Linear(in_dim, own), nn.Linear(cat, own)
        self.mu, self.log_var = nn.Linear(cat, z_dim), nn.Linear(cat, z_dim)
        self.dec = nn.Sequential(nn.Linear(z_dim, base), nn.ReLU(), nn.Linear(base, base), nn.ReLU(),
                                 nn.Linear(base, in_dim))

    def encode(self, x, prev):
        h = _lateral(F.relu(self.enc1(x.flatten(1))), prev, 0)
        h2 = _lateral(F.relu(self.enc2(h)), prev, 1)
        return self.mu(h2), self.log_var(h2), [h.detach(), h2.detach()]

    def decode_logits(self, z, shape):
        return self.dec(z).view(-1, *shape)


class CnnVae(nn.Module):
    """The authors' CnnSharingVae: conv3x3(nf)+pool+ReLU, conv3x3(2nf)+pool+ReLU, fc(4nf)+ReLU (each reading the
    earlier experts' features), mu / log var heads; unshared base-width decoder fc, fc, 4x4 transposed convs."""

    def __init__(self, in_shape, z_dim: int, base: int, ext: int, n_prev: int):
        super().__init__()
        c, h, w = in_shape
        own, cat = (base if n_prev == 0 else ext), base + n_prev * ext
        self.small = (h // 4, w // 4)
        self.enc1 = nn.Conv2d(c, own, 3, 1, 1)
        self.enc2 = nn.Conv2d(cat, 2 * own, 3, 1, 1)
        self.enc3 = nn.Linear(self.small[0] * self.small[1] * 2 * cat, 4 * own)
        self.mu, self.log_var = nn.Linear(4 * cat, z_dim), nn.Linear(4 * cat, z_dim)
        self.base = base
        self.dec = nn.Sequential(
            nn.Linear(z_dim, 4 * base), nn.ReLU(),
            nn.Linear(4 * base, self.small[0] * self.small[1] * 2 * base), nn.ReLU(),
            nn.Unflatten(1, (2 * base, *self.small)),
            nn.ConvTranspose2d(2 * base, base, 4, 2, 1), nn.ReLU(),
            nn.ConvTranspose2d(base, c, 4, 2, 1))

    def encode(self, x, prev):
        h1 = _lateral(F.relu(F.max_pool2d(self.enc1(x), 2)), prev, 0)
        h2 = _lateral(F.relu(F.max_pool2d(self.enc2(h1), 2)).flatten(1), prev, 1)
        h3 = _lateral(F.relu(self.enc3(h2)), prev, 2)
        return self.mu(h3), self.log_var(h3), [h1.detach(), h2.detach(), h3.detach()]

    def decode_logits(self, z, shape):
        return self.dec(z).view(-1, *shape)


class MlpClassifier(nn.Module):
    """The authors' MlpSharingClassifier: in -> h -> h -> classes, layers 2 and 3 reading earlier features."""

    def __init__(self, in_dim: int, n_classes: int, base: int, ext: int, n_prev: int):
        super().__init__()
        own, cat = (base if n_prev == 0 else ext), base + n_prev * ext
        self.fc1, self.fc2, self.out = nn.Linear(in_dim, own), nn.Linear(cat, own), nn.Linear(cat, n_classes)

    def forward(self, x, prev):
        h1 = _lateral(F.relu(self.fc1(x.flatten(1))), prev, 0)
        h2 = _lateral(F.relu(self.fc2(h1)), prev, 1)
        return F.log_softmax(self.out(h2), 1), [h1.detach(), h2.detach()]


class Block(nn.Module):
    """ResNet basic block with InstanceNorm (no affine, no running statistics) and bias-free convs."""

    def __init__(self, c_in: int, c_out: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.short = nn.Conv2d(c_in, c_out, 1, stride, bias=False) if stride != 1 or c_in != c_out else None

    def forward(self, x):
        out = F.relu(F.instance_norm(self.conv1(x)))
        return F.relu(F.instance_norm(self.conv2(out)) + (x if self.short is None else F.instance_norm(self.short(x))))


class ResNetClassifier(nn.Module):
    """The authors' ResNetSharingClassifier with num_blocks [1, 1, 1, 1]: conv3x3+IN+ReLU, four blocks of
    widths nf, 2nf, 4nf, 8nf (strides 1, 2, 2, 2), global average pool, linear; each stage reads earlier
    experts' features."""

    def __init__(self, in_ch: int, n_classes: int, base: int, ext: int, n_prev: int):
        super().__init__()
        own, cat = (base if n_prev == 0 else ext), base + n_prev * ext
        self.conv0 = nn.Conv2d(in_ch, own, 3, 1, 1, bias=False)
        self.blocks = nn.ModuleList([Block(cat * i, own * o, s)
                                     for i, o, s in ((1, 1, 1), (1, 2, 2), (2, 4, 2), (4, 8, 2))])
        self.out = nn.Linear(cat * 8, n_classes)

    def forward(self, x, prev):
        feats = [_lateral(F.relu(F.instance_norm(self.conv0(x))), prev, 0)]
        for i, block in enumerate(self.blocks):
            h = block(feats[-1])
            if i == 3:
                h = F.adaptive_avg_pool2d(h, 1).flatten(1)
            feats.append(_lateral(h, prev, i + 1))
        return F.log_softmax(self.out(feats[-1]), 1), [f.detach() for f in feats]


def _lateral(own: torch.Tensor, prev: list[torch.Tensor] | None, i: int) -> torch.Tensor:
    """This expert's features after the (already detached) concatenated features of the earlier experts."""
    return own if prev is None else torch.cat([prev[i], own], 1)


class Expert(nn.Module):
    """One mixture component: VAE `g`, classifier `d`, and their Adam states (expert 0: frozen, no updates)."""

    def __init__(self, cfg, in_shape: tuple[int, ...], n_classes: int, n_prev: int, device: torch.device,
                 frozen: bool = False):
        """`cfg`: the method's settings (gcl.methods.cndpm.method.CNDPMSettings): architecture, widths, lrs."""
        super().__init__()
        in_dim = math.prod(in_shape)
        if cfg.arch == "mlp":
            self.g = MlpVae(in_dim, cfg.z_dim, cfg.vae_width, cfg.vae_ext, n_prev)
            self.d = MlpClassifier(in_dim, n_classes, cfg.cls_width, cfg.cls_ext, n_prev)
        else:
            self.g = CnnVae(in_shape, cfg.z_dim, cfg.vae_width, cfg.vae_ext, n_prev)
            self.d = ResNetClassifier(in_shape[0], n_classes, cfg.cls_width, cfg.cls_ext, n_prev)
        self.to(device)
        if frozen:
            self.requires_grad_(False)
        else:   # after the move: the optimisers make the parameters views of their flat tensors
            self.opt_g = Adam(self.g, cfg.lr_vae)
            self.opt_d = Adam(self.d, cfg.lr)


class GaussianRecon(torch.autograd.Function):
    """0.5 * sum_d (x_d - sigmoid(l_d))^2 over the last axis (x broadcast over the latent samples), with a
    hand-written backward: the same values and gradients as autograd's, in fewer passes over the decoded
    images (this loss dominates the sleep phase's time). No gradient flows to x (the data)."""

    @staticmethod
    def forward(ctx, logits, x):
        mu = torch.sigmoid(logits)
        diff = mu - x
        ctx.save_for_backward(mu, diff)
        return 0.5 * torch.linalg.vecdot(diff, diff)

    @staticmethod
    def backward(ctx, grad):
        mu, diff = ctx.saved_tensors
        # d/dl 0.5 (mu - x)^2 = (mu - x) mu (1 - mu)
        return diff * (mu - mu * mu) * grad.unsqueeze(-1), None


def vae_nll(vae: nn.Module, x: torch.Tensor, prev, z_samples: int):
    """Negative ELBO per sample (16-sample average of ELBOs, unit-variance Gaussian summed over pixels without
    its constants, analytic KL to N(0, I)) and the encoder's detached features for the next expert."""
    mu, log_var, feats = vae.encode(x, prev)
    std = (0.5 * log_var).exp()
    z = mu.unsqueeze(1) + std.unsqueeze(1) * torch.randn(mu.shape[0], z_samples, mu.shape[1], device=mu.device,
                                                           dtype=mu.dtype)
    logits = vae.decode_logits(z.flatten(0, 1), x.shape[1:]).view(x.shape[0], z_samples, -1)
    recon = GaussianRecon.apply(logits, x.flatten(1).unsqueeze(1)).mean(1)
    kl = 0.5 * (log_var.exp() + mu.square() - 1 - log_var).sum(1)
    return recon + kl, feats
