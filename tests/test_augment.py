"""Batched crop + flip + normalise: equal to torchvision's per-image transforms, fresh per call, seeded."""
import torch
import torchvision.transforms.v2.functional as TF

from gcl.data.augment import Normalize, TrainAugment, crop_flip, random_crop_flip

CIFAR10 = ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2615))


def _images(n=16, size=32, seed=0):
    return torch.randint(0, 256, (n, 3, size, size), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))


def test_crop_flip_equals_torchvision_per_image():
    x = _images(40, 32)
    g = torch.Generator().manual_seed(1)
    top, left = torch.randint(0, 9, (40,), generator=g), torch.randint(0, 9, (40,), generator=g)
    flip = torch.rand(40, generator=g) < 0.5
    ref = []
    for i in range(40):   # RandomCrop(32, padding=4) then RandomHorizontalFlip, with these draws
        img = TF.crop(TF.pad(x[i], [4]), int(top[i]), int(left[i]), 32, 32)
        ref.append(TF.horizontal_flip(img) if flip[i] else img)
    assert torch.equal(crop_flip(x, top, left, flip, 4), torch.stack(ref))
    assert flip.any() and not flip.all()


def test_non_square_and_64px_images():
    x = _images(4, 64)[:, :, :, :48]
    top, left = torch.tensor([0, 8, 3, 4]), torch.tensor([8, 0, 5, 4])
    flip = torch.tensor([True, False, True, False])
    out = crop_flip(x, top, left, flip, 4)
    assert out.shape == x.shape
    assert torch.equal(out[3], x[3])                                  # offset (4, 4), no flip: identity
    # image 0: window at (0, 8) of the padded 72x56 copy, mirrored: 4 rows of padding on top, and
    # (after the mirror) 4 columns of padding on the left, then columns 47..4 of the original
    assert (out[0][:, :4] == 0).all() and (out[0][:, :, :4] == 0).all()
    assert torch.equal(out[0][:, 4:, 4:], x[0][:, :60, 4:48].flip(-1))


def test_normalize_matches_torchvision_normalize():
    x = _images()
    mean, std = CIFAR10
    ref = TF.normalize(x.float() / 255.0, list(mean), list(std))
    out = Normalize(mean, std)(x)
    assert out.dtype == torch.float32 and torch.allclose(out, ref, atol=1e-5)
    assert torch.equal(Normalize(None, None)(x), x.float() / 255.0)


def test_random_draws_are_fresh_per_call_and_follow_the_global_seed():
    x = _images(64)
    aug = TrainAugment(Normalize(*CIFAR10))
    torch.manual_seed(0)
    a, b = aug(x), aug(x)
    torch.manual_seed(0)
    a2 = aug(x)
    assert not torch.equal(a, b)          # a replayed image gets a new crop/flip every time
    assert torch.equal(a, a2)             # and the run's seed fixes them


def test_offsets_and_flips_cover_their_range():
    x = torch.zeros(1, 1, 8, 8, dtype=torch.uint8)
    x[0, 0, 0, 0] = 255                    # where the marked pixel lands tells the offset and the flip
    torch.manual_seed(0)
    seen = set()
    for _ in range(400):
        out = random_crop_flip(x, padding=4)[0, 0]
        hit = (out == 255).nonzero()
        if len(hit):
            seen.add((int(hit[0, 0]), int(hit[0, 1])))
    rows = {r for r, _ in seen}
    cols = {c for _, c in seen}
    assert rows == set(range(0, 5)) and cols == set(range(0, 8))   # shifts 0..4 down, both mirror sides
