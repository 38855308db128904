"""Batched rotation: exact at right angles, counter-clockwise, equal to torchvision's per-image rotate."""
import pytest
import torch
import torchvision.transforms.functional as TF

from gcl.data.transforms import rotate, to_unit_float


@pytest.fixture
def images():
    return torch.randint(0, 256, (6, 1, 28, 28), generator=torch.Generator().manual_seed(0), dtype=torch.uint8)


@pytest.mark.parametrize("k", [0, 1, 2, 3])
def test_right_angles_are_exact_rot90(images, k):
    out = rotate(images, torch.full((len(images),), 90.0 * k))
    assert out.dtype == torch.uint8
    assert torch.equal(out, torch.rot90(images, k, dims=(-2, -1)))


def test_positive_angles_turn_counter_clockwise():
    img = torch.zeros(1, 1, 5, 5, dtype=torch.uint8)
    img[0, 0, 2, 4] = 255                     # a dot right of the centre
    out = rotate(img, torch.tensor([90.0]))
    assert out[0, 0, 0, 2] == 255             # ... ends up above it


def test_matches_torchvision_rotate_per_image(images):
    angles = torch.tensor([13.0, 47.5, 120.0, 200.25, 300.0, 359.0])
    ours = rotate(images, angles)
    for img, a, mine in zip(images, angles, ours):
        ref = TF.rotate(img, float(a), interpolation=TF.InterpolationMode.NEAREST)
        # nearest-neighbour ties may round differently on a handful of border pixels
        assert (ref != mine).float().mean() < 0.01


def test_each_image_gets_its_own_angle(images):
    mixed = rotate(images[:2], torch.tensor([0.0, 180.0]))
    assert torch.equal(mixed[0], images[0])
    assert torch.equal(mixed[1], torch.rot90(images[1], 2, dims=(-2, -1)))


def test_to_unit_float():
    x = torch.tensor([0, 51, 255], dtype=torch.uint8)
    assert torch.allclose(to_unit_float(x), torch.tensor([0.0, 0.2, 1.0]))
