"""Geometric pretext tasks for CoCa's L_PT (paper Eq. 12): a transformation per image and its proxy label.

Two variants (see gcl.methods.coca.method for why each exists):

- "paper": the transformations of the paper's Section IV-B, rotation {0, 90, 180, 270} degrees,
  scale {0.67, 1.0} and aspect ratio {0.67, 1.33}, read as 4 shapes x 4 rotations = 16 classes,
      shape 0 identity, 1 scale 0.67, 2 aspect 0.67, 3 aspect 1.33,   label = 4 * shape + k
  (the authors' task-boundary code has 16 classes too: 4 rotations x {identity and three
  resized/aspect crops}). "Only one random transformation per sample": one label is drawn per image.
- "rotation": the authors' general-continual code, 4 rotations only (label = k). That code also
  applies a fixed resized crop first, of unstated size; it is left out here.

Shapes are centred resized crops, as torchvision's RandomResizedCrop with a fixed scale (area
fraction) and ratio (width / height): scale 0.67 keeps the central square of 0.67 of the area;
aspect r keeps the largest centred crop of width/height r. Each crop is resized back to the full
size (bilinear), so no pixel outside the image is ever sampled (no padding on normalised inputs).
The rotation, counter-clockwise by 90k degrees, is applied after the crop.

Everything is batched on the images' device. With crops, one grid_sample does crop and rotation
together: a quarter turn of the output is a permutation of its pixels, and so of the sampling grid's
positions, so the grid of label 4 * shape + k is the shape's crop grid turned k times (the 16 grids are
built once per image size and device), and each output pixel is computed exactly as sampling then
turning would (tested bit for bit). Without crops ("rotation") the turns are torch.rot90 gathered
per image.
"""
from __future__ import annotations

import math
from functools import lru_cache

import torch
import torch.nn.functional as F

from gcl.core.buffer import to_device

N_ROTATIONS = 4
# (width fraction, height fraction) of each centred crop, in the input's normalised coordinates
SHAPES = {
    "identity": (1.0, 1.0),
    "scale-0.67": (math.sqrt(0.67), math.sqrt(0.67)),   # area 0.67, square
    "aspect-0.67": (0.67, 1.0),                         # width / height = 0.67
    "aspect-1.33": (1.0, 1.0 / 1.33),                   # width / height = 1.33
}
VARIANTS = {"paper": tuple(SHAPES), "rotation": ("identity",)}


def n_pretext_classes(variant: str) -> int:
    if variant not in VARIANTS:
        raise ValueError(f"unknown pretext variant {variant!r}; known: {sorted(VARIANTS)}")
    return len(VARIANTS[variant]) * N_ROTATIONS


def decode(labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(shape index within the variant, number of quarter turns) of each proxy label."""
    return labels // N_ROTATIONS, labels % N_ROTATIONS


def crop_grid(width: torch.Tensor, height: torch.Tensor, shape: list[int]) -> torch.Tensor:
    """Sampling grid of the centred crop of relative size (width[i], height[i]), resized to `shape`."""
    zero = torch.zeros_like(width)
    # affine_grid maps output coordinates in [-1, 1] to input coordinates: scaling them by the crop's
    # half-extents samples exactly the crop, stretched over the whole output
    theta = torch.stack([torch.stack([width, zero, zero], 1), torch.stack([zero, height, zero], 1)], 1)
    return F.affine_grid(theta, shape, align_corners=False)


@lru_cache(maxsize=32)
def _shape_grids(variant: str, height: int, width: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """One crop grid per shape of the variant, (n_shapes, H, W, 2): built once, gathered per image."""
    extents = torch.tensor([SHAPES[s] for s in VARIANTS[variant]], dtype=dtype, device=device)
    return crop_grid(extents[:, 0], extents[:, 1], [len(extents), 1, height, width])


@lru_cache(maxsize=32)
def _label_grids(variant: str, height: int, width: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """One sampling grid per proxy label, (n_labels, H, W, 2): the shape's crop grid turned `k` quarter turns over
    its (H, W) positions, so that sampling with it gives the crop already rotated."""
    shapes = _shape_grids(variant, height, width, dtype, device)
    return torch.stack([torch.rot90(shapes[s], k, dims=(0, 1)) for s in range(len(shapes)) for k in range(N_ROTATIONS)])


def quarter_turns(images: torch.Tensor, turns: torch.Tensor) -> torch.Tensor:
    """Each image rotated counter-clockwise by turns[i] * 90 degrees: exact (a permutation of pixels)."""
    rotated = torch.stack([torch.rot90(images, k, dims=(-2, -1)) for k in range(N_ROTATIONS)])
    return rotated[turns, torch.arange(images.shape[0], device=images.device)]


def apply_pretext(images: torch.Tensor, labels: torch.Tensor, variant: str) -> torch.Tensor:
    """The transformation that each proxy label names, applied to a float batch (N, C, H, W), H == W."""
    if images.shape[-1] != images.shape[-2]:
        raise ValueError(f"pretext rotations by 90 degrees need square images, got {tuple(images.shape[-2:])}")
    labels = labels.to(images.device)
    if len(VARIANTS[variant]) == 1:      # rotations only: no resampling at all
        return quarter_turns(images, decode(labels)[1])
    grids = _label_grids(variant, images.shape[-2], images.shape[-1], images.dtype, images.device)
    return F.grid_sample(images, grids[labels], mode="bilinear", padding_mode="border", align_corners=False)


def random_pretext(images: torch.Tensor, variant: str, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """One random transformation per image: (transformed images, proxy labels on the images' device).

    Labels are drawn on the host with the run's generator (as the buffer's decisions are), so a run is
    identical on CPU and GPU and nothing waits on the device.
    """
    labels = pretext_labels(images.shape[0], variant, generator, images.device)
    return apply_pretext(images, labels, variant), labels


def pretext_labels(count: int, variant: str, generator: torch.Generator, device: torch.device) -> torch.Tensor:
    """`count` random proxy labels, drawn on the host from `generator` (random_pretext's draw)."""
    labels = torch.randint(0, n_pretext_classes(variant), (count,), generator=generator)
    return to_device(labels, device)
