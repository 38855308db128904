"""Batched image transforms that run on whatever device the batch lives on (no per-sample Python)."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def rotate(images: torch.Tensor, degrees: torch.Tensor) -> torch.Tensor:
    """Rotate each image counter-clockwise by its own angle about the image centre.

    Nearest-neighbour sampling and zero fill, as torchvision's `rotate` does by default, so uint8
    inputs come back as uint8 with unchanged pixel values. `degrees` has one entry per image.
    """
    if images.shape[0] == 0:
        return images.clone()
    rad = degrees.to(device=images.device, dtype=torch.float64) * (math.pi / 180.0)
    cos, sin = torch.cos(rad), torch.sin(rad)
    zero = torch.zeros_like(cos)
    # affine_grid maps output coordinates (x right, y down, in [-1, 1]) to input coordinates:
    # sampling the input at R(-a) p turns the picture by +a, counter-clockwise on screen.
    theta = torch.stack([torch.stack([cos, -sin, zero], 1), torch.stack([sin, cos, zero], 1)], 1)
    grid = F.affine_grid(theta.float(), list(images.shape), align_corners=False)
    out = F.grid_sample(images.float(), grid, mode="nearest", padding_mode="zeros", align_corners=False)
    return out.round().to(images.dtype) if not images.is_floating_point() else out


def to_unit_float(images: torch.Tensor) -> torch.Tensor:
    """uint8 pixels to floats in [0, 1] (MNIST-360 uses no augmentation and no normalisation): float32, or torch's
    default float type where a test sets another (float64, in which stacked and lone seeds must agree)."""
    return images.to(torch.get_default_dtype()).div_(255.0)
