"""Batched train augmentation and normalisation on the training device (no per-sample Python).

Train: RandomCrop(size, padding) with zero fill + horizontal flip (p = 0.5), then normalise, the same
map as torchvision's RandomCrop -> RandomHorizontalFlip -> ToTensor -> Normalize, for a whole uint8
batch at once: the batch is padded once and one gather reads every sample's own window, flipped
or not. Random offsets and flips come from torch's global RNG on the batch's device, which the
training loop seeds per run, so CPU runs are reproducible and nothing is synchronised with the host.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from gcl.data.transforms import to_unit_float


def crop_flip(images: torch.Tensor, top: torch.Tensor, left: torch.Tensor, flip: torch.Tensor,
              padding: int) -> torch.Tensor:
    """Each image's (H, W) window at (top, left) of its zero-padded copy, mirrored where `flip`."""
    b, c, h, w = images.shape
    padded = F.pad(images, (padding,) * 4)
    wp = w + 2 * padding
    cols = torch.arange(w, device=images.device)
    cols = torch.where(flip[:, None], (w - 1) - cols, cols) + left[:, None]                  # (B, W)
    rows = torch.arange(h, device=images.device)[None, :] + top[:, None]                     # (B, H)
    flat = (rows[:, :, None] * wp + cols[:, None, :]).view(b, 1, h * w).expand(b, c, h * w)
    return padded.reshape(b, c, -1).gather(2, flat).view(b, c, h, w)


def crop_flip_draws(count: int, padding: int, device: torch.device,
                    generator: torch.Generator | None = None) -> tuple[torch.Tensor, ...]:
    """`count` random crop offsets (top, left) and flips, drawn in this order from `generator` (None: torch's
    global generator of `device`)."""
    top = torch.randint(0, 2 * padding + 1, (count,), device=device, generator=generator)
    left = torch.randint(0, 2 * padding + 1, (count,), device=device, generator=generator)
    flip = torch.rand(count, device=device, generator=generator) < 0.5
    return top, left, flip


def random_crop_flip(images: torch.Tensor, padding: int = 4) -> torch.Tensor:
    """A fresh random crop offset and flip for every image of the batch."""
    return crop_flip(images, *crop_flip_draws(images.shape[0], padding, images.device), padding)


class Normalize:
    """uint8 pixels -> float32 (x / 255 - mean) / std per channel; the constants live on each device used."""

    def __init__(self, mean: Sequence[float] | None, std: Sequence[float] | None):
        self.mean, self.std = mean, std
        self._per_device: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}

    def _constants(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        if device not in self._per_device:
            mean = torch.tensor(self.mean, dtype=torch.float32).view(1, -1, 1, 1)
            std = torch.tensor(self.std, dtype=torch.float32).view(1, -1, 1, 1)
            # one multiply-add: x * 1 / (255 std) - mean / std
            self._per_device[device] = ((1.0 / (255.0 * std)).to(device), (mean / std).to(device))
        return self._per_device[device]

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        if self.mean is None:   # no dataset statistics (MNIST): pixels in [0, 1]
            return to_unit_float(images)
        scale, shift = self._constants(images.device)
        return torch.addcmul(-shift, images.float(), scale)


class TrainAugment:
    """Random crop with `padding` + flip, then `normalize`; applied afresh to every batch it is given."""

    def __init__(self, normalize: Normalize, padding: int = 4):
        self.normalize, self.padding = normalize, padding

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        return self.normalize(random_crop_flip(images, self.padding))


class SeedwiseTransform:
    """A training transform applied to S seeds' batches at once, (S, B, ...) -> (S, B, ...), for seeds trained
    stacked (gcl.training.stacking). A TrainAugment draws each seed's crops and flips from that seed's own
    generator (on the batch's device), the draws a lone seed makes from the global generator in the same order,
    so that each seed's images are augmented exactly as they would be alone; other transforms draw nothing."""

    def __init__(self, transform, generators: list[torch.Generator]):
        self.transform, self.generators = transform, generators

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        s, b = images.shape[:2]
        flat = images.reshape(s * b, *images.shape[2:])
        if isinstance(self.transform, TrainAugment):
            padding = self.transform.padding
            draws = [crop_flip_draws(b, padding, images.device, g) for g in self.generators]
            top, left, flip = (torch.cat(d) for d in zip(*draws))
            out = self.transform.normalize(crop_flip(flat, top, left, flip, padding))
        else:
            out = self.transform(flat)
        return out.view(s, b, *out.shape[1:])
