"""Synthetic data for unit tests: shared by the test modules (imported as `from helpers import ...`)."""
from __future__ import annotations

import torch


def synthetic_source(per_class: int = 30, test_per_class: int = 6, classes: int = 10, seed: int = 0) -> dict:
    """A source dict in the exact shape sources.py writes, with class-dependent blobs as images."""
    g = torch.Generator().manual_seed(seed)

    def make(n):
        y = torch.arange(classes).repeat_interleave(n)
        x = torch.randint(0, 60, (len(y), 1, 28, 28), generator=g, dtype=torch.uint8)
        for c in range(classes):   # a bright square whose position encodes the class
            r, col = 2 + 2 * (c // 4) * 3, 2 + (c % 4) * 6
            x[y == c, :, r:r + 6, col:col + 6] = 255
        return x, y

    train_x, train_y = make(per_class)
    test_x, test_y = make(test_per_class)
    return {"train_x": train_x, "train_y": train_y, "test_x": test_x, "test_y": test_y,
            "classes": [str(c) for c in range(classes)]}


def benchmark_settings(**block):
    """A benchmark block of params.yaml (`benchmarks.<name>`), validated as its kind's settings: `.data()` and
    `.training()` are what a benchmark file is built from and what a run trains with."""
    from gcl.data.benchmarks import KINDS
    return KINDS[block["kind"]].model_validate(block)


def mnist360_settings(**block):
    """A small MNIST-360 benchmark's settings (the synthetic digits' source, the MLP, one pass)."""
    return benchmark_settings(**{"kind": "mnist-360", "source": "synthetic", "backbone": "mlp", "epochs": 1, **block})


def sequential_settings(**block):
    """A small sequential benchmark's settings: 5 tasks of 2 classes of the synthetic digits, the MLP, one epoch."""
    return benchmark_settings(**{"kind": "sequential", "source": "synthetic", "backbone": "mlp", "epochs": 1,
                                 "n_tasks": 5, "classes_per_task": 2, **block})


def run_settings(algorithm: str, buffer: int | str = "none", **settings):
    """A run's flat settings (the method's Run) for tests that build a method or train a seed directly: `settings`
    over the class's defaults; benchmark and method are placeholders."""
    from gcl.methods import METHODS
    return METHODS[algorithm].Run(benchmark="test", method=algorithm, buffer=buffer, **settings)


def small_er_run(seeds: list[int], stack: bool | str = False):
    """A resolved ER run (key "er-50") on a small synthetic MNIST-360, its benchmark file written under the current
    folder where the run reads it: what the tests of whole runs (resume, faults, parallel seeds) train. Its seeds
    train alone unless `stack` says otherwise."""
    from gcl.config import resolve_run
    from gcl.core.atomic import save_tensors
    from gcl.data import mnist360

    bench_cfg = {"kind": "mnist-360", "source": "synthetic", "backbone": "mlp", "epochs": 1, "stack": stack}
    params = {"seeds": seeds, "device": "cpu", "sources": {"synthetic": {}}, "benchmarks": {"mnist-360": bench_cfg},
              "methods": {"er": {}}, "runs": {"er-50": {"benchmark": "mnist-360", "method": "er", "buffer": 50,
                                                         "lr": 0.1, "batch": 4, "replay_batch": 8}}}
    spec = resolve_run(params, "er-50")
    bench = mnist360.build_benchmark(synthetic_source(per_class=60), spec.data)
    bench["config"] = spec.data.model_dump(mode="json")
    save_tensors("data/benchmarks/mnist-360/benchmark.pt", bench)
    return spec



class CountingNet(torch.nn.Module):
    """A backbone-like net that records the size of every batch it is passed (a deep copy of it too): a Linear +
    BatchNorm1d body (flat inputs), whose batch statistics tell one pass from two, and a linear classifier."""

    def __init__(self, features: int, hidden: int, classes: int):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(features, hidden), torch.nn.BatchNorm1d(hidden))
        self.classifier = torch.nn.Linear(hidden, classes)
        self.passes = []

    def features(self, x):
        return self.body(x)

    def forward(self, x):
        self.passes.append(len(x))
        return self.classifier(self.features(x))
