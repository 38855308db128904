"""MNIST-360's schedule: segment order, chunking, proportional batches, rotation angles, test sweep."""
import numpy as np
import pytest
import torch

from gcl.data import mnist360
from gcl.data.transforms import rotate
from helpers import synthetic_source

DATA = mnist360.Mnist360.Data(source="synthetic")       # the data settings, as a params block's defaults make them
WITHOUT = "without-replacement"                         # each chunk image drawn once (the setting's default)


def test_segments_are_the_nine_pairs_three_times():
    pairs = mnist360.segment_pairs()
    assert len(pairs) == 27
    assert pairs[:9] == [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5), (5, 6), (6, 7), (7, 8), (8, 0)]
    assert pairs[9:18] == pairs[:9] == pairs[18:]
    # every class appears exactly six times: once per chunk
    counts = np.bincount(np.array(pairs).ravel(), minlength=9)
    assert counts.tolist() == [6] * 9


def test_chunks_cover_the_class_last_chunk_first():
    bounds = mnist360.chunk_bounds(400)
    assert bounds[0] == (335, 400) and bounds[-1] == (0, 67)
    assert sorted(bounds) == [(0, 67), (67, 134), (134, 201), (201, 268), (268, 335), (335, 400)]


def test_proportional_batches_stop_when_a_chunk_runs_out():
    batches = mnist360.segment_batches(10, 30, 4)
    assert batches[0] == (1, 3)
    assert all(a + b <= 4 for a, b in batches)
    used_a, used_b = sum(a for a, _ in batches), sum(b for _, b in batches)
    assert (used_a == 10) or (used_b == 30)
    assert used_a <= 10 and used_b <= 30


@pytest.mark.parametrize("batch, steps", [(1, 3573), (4, 910), (8, 459), (16, 243)])
def test_step_counts_match_the_reference_on_400_digits_per_class(batch, steps):
    bench = {"class_sizes": [400] * 9, "train_x": torch.zeros(3600, 1, 2, 2, dtype=torch.uint8),
             "train_y": torch.arange(9).repeat_interleave(400)}
    stream = mnist360.build_stream(bench, batch, torch.Generator().manual_seed(0), WITHOUT)
    assert stream.steps == steps
    assert len(stream.eval_after) == 27 and stream.eval_after[-1] == steps - 1
    assert stream.task_ends == []


def test_angles_follow_the_schedule():
    # class 0 starts at -60 degrees (= 300), class 1 at 0, class 2 at 60; each turns 360 over its images
    assert mnist360.train_angle(np.array([0]), 400, 0)[0] == pytest.approx(300.0)
    assert mnist360.train_angle(np.array([0]), 400, 1)[0] == pytest.approx(0.0)
    assert mnist360.train_angle(np.array([200]), 400, 2)[0] == pytest.approx(240.0)
    assert mnist360.test_angle(np.array([0, 25, 50, 75]), 100).tolist() == [0.0, 90.0, 180.0, 270.0]


def _labels_by_batch(stream):
    return [stream.labels[stream.order[lo:hi]].tolist() for lo, hi in zip(stream.bounds[:-1], stream.bounds[1:])]


def test_stream_batches_mix_exactly_the_active_pair():
    bench = mnist360.build_benchmark(synthetic_source(per_class=60), DATA)
    stream = mnist360.build_stream(bench, 4, torch.Generator().manual_seed(1), WITHOUT)
    pairs = mnist360.segment_pairs()
    seg = 0
    for step, labels in enumerate(_labels_by_batch(stream)):
        assert set(labels) <= set(pairs[seg]), (step, labels, pairs[seg])
        if step in stream.eval_after:
            seg += 1
    assert seg == 27


def test_stream_images_are_the_source_images_rotated_by_the_schedule():
    source = synthetic_source(per_class=60)
    bench = mnist360.build_benchmark(source, DATA)
    stream = mnist360.build_stream(bench, 1, torch.Generator().manual_seed(2), WITHOUT)
    # the first image drawn of class 1 (segment (0, 1)) is unrotated; of class 0 it is turned 300 degrees
    labels = stream.labels.tolist()
    first_of = {c: labels.index(c) for c in (0, 1)}
    train_of = {c: bench["train_x"][bench["train_y"] == c] for c in (0, 1)}
    img1 = stream.images[first_of[1]]
    assert any(torch.equal(img1, x) for x in train_of[1])
    img0 = stream.images[first_of[0]]
    candidates = rotate(train_of[0], torch.full((len(train_of[0]),), 300.0))
    assert any(torch.equal(img0, x) for x in candidates)


def test_each_image_is_drawn_at_most_once_without_replacement():
    bench = mnist360.build_benchmark(synthetic_source(per_class=60), DATA)
    stream = mnist360.build_stream(bench, 4, torch.Generator().manual_seed(3), WITHOUT)
    assert len(set(stream.origin.tolist())) == len(stream.origin)
    assert torch.equal(bench["train_y"][stream.origin], stream.labels)
    replaced = mnist360.build_stream(bench, 4, torch.Generator().manual_seed(3), "with-replacement")
    assert len(set(replaced.origin.tolist())) < len(replaced.origin)


def test_same_seed_same_stream_other_seed_other_order():
    bench = mnist360.build_benchmark(synthetic_source(per_class=60), DATA)
    s1, s2, s3 = (mnist360.build_stream(bench, 4, torch.Generator().manual_seed(s), WITHOUT) for s in (5, 5, 6))
    assert torch.equal(s1.images, s2.images) and s1.bounds == s2.bounds
    assert not torch.equal(s1.origin, s3.origin)


def test_test_sweep_rotates_each_class_through_360_degrees():
    source = synthetic_source(per_class=30, test_per_class=4)
    bench = mnist360.build_benchmark(source, DATA)
    assert bench["test_y"].tolist() == [c for c in range(9) for _ in range(4)]
    digit3 = source["test_x"][source["test_y"] == 3]
    expected = rotate(digit3, torch.tensor([0.0, 90.0, 180.0, 270.0]))
    assert torch.equal(bench["test_x"][bench["test_y"] == 3], expected)
    assert torch.equal(expected[1], torch.rot90(digit3[1], 1, dims=(-2, -1)))


def test_validation_split_replaces_the_test_set():
    source = synthetic_source(per_class=30, test_per_class=4)
    bench = mnist360.build_benchmark(source, DATA.model_copy(update={"validation_fraction": 0.2}))
    assert bench["class_sizes"] == [24] * 9
    assert len(bench["test_y"]) == 9 * 6 and bench["evaluated_on"] == "validation"
    held = source["train_x"][source["train_y"] == 0][24:]
    assert torch.equal(bench["test_x"][:6][0], held[0])   # first image of the sweep is unrotated
