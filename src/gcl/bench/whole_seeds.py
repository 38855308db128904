"""Whole seeds timed for `python -m gcl.bench steps`: `--cell <run>`, one seed of a run of params.yaml as `dvc repro`
trains it (its real benchmark file, nothing written), and `--stacked S`, S seeds of every stackable method trained as
one stacked network against the same seeds trained one after the other, on random images of the benchmark's shape.

Both report training seconds as the seeds themselves measure them (train_seconds: evaluations left out).
"""
from __future__ import annotations

import sys

import torch

from gcl.bench.common import random_benchmark, run_as
from gcl.config import load_params, resolve_run, resolve_runtime
from gcl.core.devices import resolve_device
from gcl.core.layout import benchmark_file
from gcl.data.benchmarks import load_benchmark
from gcl.data.random_sources import SOURCE_SHAPES, random_source
from gcl.methods import METHODS
from gcl.training.compilation import compile_mode
from gcl.training.stacking import unstackable
from gcl.training.train import run_seed, train_stacked


def time_cell(args) -> None:
    """One seed of one params.yaml cell, as `dvc repro` would train it, without writing anything."""
    params = load_params(args.profile or "params.yaml")
    spec = resolve_run(params, args.cell)
    torch.set_num_threads(resolve_runtime(params)["threads"])
    device = resolve_device(spec.device)
    bench = load_benchmark(benchmark_file(spec.run.benchmark), spec.data)
    compiled = compile_mode(spec.benchmark.compile, device, METHODS[spec.run.algorithm])
    r = run_seed(bench, spec.benchmark, spec.run, args.seed, device, compiled=compiled)
    til = "-" if r.task_il is None else f"{r.task_il:.2f}"
    print(f"{args.cell} seed {args.seed} on {device.type} ({torch.get_num_threads()} threads): {r.steps} steps, "
          f"{r.train_seconds:.1f} s training, {r.samples_per_second:.0f} samples/s, "
          f"{1e3 * r.train_seconds / r.steps:.1f} ms/step; class-il {r.class_il:.2f}, task-il {til}")


# --stacked: each backbone's profile, benchmark, source shape and preferred buffer (the first run of a method on the
# benchmark, at that buffer if it has one there, is timed)
STACKED_BENCHMARKS = {"mlp": ("params.yaml", "mnist-360", "mnist", 200),
                      "resnet18": ("profiles/paper.yaml", "seq-cifar10", "cifar10", 500)}


def stacked_table(args) -> list[dict]:
    """Per stackable method (trains_alone None), a whole stream of `args.stacked` seeds trained stacked and the
    same seeds trained one after the other in this process (run_seed), at the settings of the method's run on the
    backbone's benchmark (MLP: params.yaml's MNIST-360; ResNet-18: profiles/paper.yaml's seq-CIFAR-10, one epoch)
    on random images of the benchmark's shape: training seconds per seed-step of each (evaluations left out, as a
    seed's own train_seconds leave them out)."""
    profile, benchmark, source, buffer = STACKED_BENCHMARKS[args.backbone]
    profile = args.profile or profile
    params = load_params(profile)
    device = torch.device("cuda" if args.device == "cuda" else "cpu")
    seeds, rows = list(range(args.stacked)), []
    for method in args.methods or sorted(k for k, cls in METHODS.items() if not cls.trains_alone):
        keys = sorted((r.get("buffer") != (args.buffer or buffer), k) for k, r in params["runs"].items()
                      if r["method"] == method and r["benchmark"] == (args.benchmark or benchmark))
        if not keys:
            print(f"[skip] {method}: no {benchmark} run of it in {profile}", file=sys.stderr)
            continue
        spec = resolve_run(params, keys[0][1])
        run = run_as(spec.run, METHODS[spec.run.algorithm], args.set)
        training = spec.benchmark
        if args.backbone == "resnet18":      # a pass over a short stream; the width as asked; both sides in the
            # default layout, the only one a stacked ResNet takes (a profile's channels_last is timed by --online)
            training = training.model_copy(update={"epochs": 1, "width": args.width, "channels_last": False})
        if unstackable(training, run):
            print(f"[skip] {method}: {unstackable(training, run)}", file=sys.stderr)
            continue
        bench = random_benchmark(spec.data, random_source(SOURCE_SHAPES[source], args.per_class, 4))
        alone = sum(run_seed(bench, training, run, seed, device).train_seconds for seed in seeds)
        together = train_stacked(bench, training, run, seeds, device)
        steps = together[0].steps
        stacked = sum(r.train_seconds for r in together.values())
        rows.append({"method": method, "run": keys[0][1], "seeds": len(seeds), "steps": steps,
                     "alone_ms": 1e3 * alone / (steps * len(seeds)), "stacked_ms": 1e3 * stacked / (steps * len(seeds))})
    print(f"{args.benchmark or benchmark} stream of {args.per_class} random images per class, {args.backbone}"
          f"{f' width {args.width}' if args.width else ''}, {device.type}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} thread(s){''.join(f', {p}' for p in args.set)}: ms of training per seed-step")
    print(f"{'method':<8}{'seeds':>6}{'steps':>7}{'alone':>9}{'stacked':>9}{'speed-up':>10}  run")
    for r in rows:
        print(f"{r['method']:<8}{r['seeds']:>6}{r['steps']:>7}{r['alone_ms']:>9.3f}{r['stacked_ms']:>9.3f}"
              f"{r['alone_ms'] / r['stacked_ms']:>9.2f}x  {r['run']}")
    return rows
