"""Benchmarks of the training code on this machine: `python -m gcl.bench <command>` (gcl.bench.__main__ lists them).

Each times the real code (the methods, the training loop, `dvc repro`) on random images of the real shapes or on the
project's own pipeline, and prints what it measured with the machine, device and torch version it ran on; none writes
the project's outputs (runs/, results/, dvc.lock), only the files it is told to. Profiles and params.yaml are read
from the current folder, the project's root, as the stages read them. What was measured, and when, is in
docs/performance.md.
"""
