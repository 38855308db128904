"""Shared fixtures: small benchmarks made from synthetic digits, so unit tests need no download."""
from __future__ import annotations

import pytest
import torch

from gcl.data import mnist360
from helpers import mnist360_settings, synthetic_source

torch.set_num_threads(1)   # small ops: one thread is much faster on these 2-core machines


@pytest.fixture
def tiny_mnist360():
    """A small MNIST-360 benchmark of synthetic digits and its training settings."""
    settings = mnist360_settings()
    bench = mnist360.build_benchmark(synthetic_source(per_class=60), settings.data())
    bench["config"] = settings.data().model_dump(mode="json")
    return bench, settings.training()


@pytest.fixture(autouse=True, scope="session")
def short_lived_warm_servers():
    """Stages that tests start hand themselves to warm servers (gcl.warm); let those go soon after the tests."""
    import os
    os.environ.setdefault("GCL_WARM_KEEP_ALIVE", "15")
    yield
