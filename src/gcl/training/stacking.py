"""A run's seeds trained stacked: one network for S seeds (gcl.core.stacked), one step for all of them, through the
one loop (gcl.training.loop).

Each seed is set up exactly as it is alone (setup_seed: its generator, its stream, its network's initial weights, its
method's state, its evaluator), then its network joins the stacked one and its method's state the stacked method's:
the same method class, whose step is written over the seed axis (gcl.core.seeds). Every seed's stream has the same
batch sizes (they follow from the class counts, not from the draw), so step k takes batch k of every seed's own
stream. At each evaluation point every seed's state is copied back into its own method and scored by its own
evaluator, and each seed's result is made as a lone seed's is (seed_result), recording `stacked`: how many seeds
trained together. In float64 a stacked seed equals its lone run to rounding (tests/test_stacking.py); in float32
the batched and the lone kernels round differently, so the two paths agree in distribution, each deterministic on one
machine.

A seed's augmentation draws from the global generator when it trains alone, and nothing else of a stackable method's
step does (their draws come from each seed's own generator, ctx.seeds); so each stacked seed takes, right after its
setup, a generator in the state the global one would start its training with, and draws its crops and flips from it
(gcl.data.augment.SeedwiseTransform).

Stacks: every method whose `trains_alone` is None, on the MLP and the ResNet-18, eager, fp32 (or the default float
type); `unstackable` says why another run does not."""
from __future__ import annotations

import dataclasses

import torch

from gcl.core.seeds import Seeds
from gcl.core.stacked_resnet import stack_networks
from gcl.data.augment import SeedwiseTransform
from gcl.data.benchmarks import BenchmarkData, TrainingSettings
from gcl.methods import METHODS
from gcl.methods.base import RunSettings
from gcl.training.compilation import may_compile
from gcl.training.loop import StreamLoop
from gcl.training.seed import setup_seed


def unstackable(training: TrainingSettings, run: RunSettings, device: str | None = None) -> str | None:
    """Why the seeds of this run cannot train stacked (None: they can), whatever its `stack` setting says. With
    `device` (params.yaml's, at check@runs) also where `compile: auto` may compile the run there, on a GPU; without
    it only `compile: true` counts (a run decides `auto` on its machine, gcl.training.run)."""
    alone = METHODS[run.algorithm].trains_alone
    if alone:
        return f"{run.algorithm}: {alone}"
    if training.backbone == "mlp" and training.input_size is not None:
        return "a stacked MLP takes its input as it is (input_size: none)"
    if training.bf16:
        return "the stacked step runs in full precision"
    if may_compile(training.compile, device or "cpu", METHODS[run.algorithm]):
        where = " on a GPU (device: auto or cuda)" if training.compile == "auto" else ""
        return (f"compile: {str(training.compile).lower()} compiles its backbone{where}, and compiled seeds do not "
                "stack (the benchmark's compile: false stacks them)")
    if training.channels_last:
        return "a stacked ResNet-18 keeps the default memory layout"
    if run.head != "linear":
        return f"a stacked network's head is linear, not {run.head}"
    return None


def stacks(training: TrainingSettings, run: RunSettings, seeds: int) -> bool:
    """Whether `seeds` seeds of this run train stacked (never one seed): `stack` true where the run stacks, or auto
    where it stacks and stacking pays, i.e. on the MLP (a stacked ResNet-18 step is slower than lone ones on a CPU,
    docs/performance.md; on a GPU a compiled run, auto there, does not stack)."""
    if seeds < 2 or training.stack is False or unstackable(training, run) is not None:
        return False
    return training.stack is True or training.backbone == "mlp"


def stacked_loop(bench: BenchmarkData, training: TrainingSettings, run: RunSettings, seeds: list[int],
                 device: torch.device) -> StreamLoop:
    """The loop of `seeds` of `run` trained as one stacked group: each seed set up as it is alone (setup_seed), then
    their networks stacked into one and their methods' state into one method of the same class (Method.stack),
    whose every draw is each seed's own (ctx.seeds), and each seed's crops and flips drawn from a generator of its
    own in the state the global one would have at the start of its lone training (SeedwiseTransform)."""
    why = unstackable(training, run)
    if why is not None:
        raise ValueError(f"{run.method}: cannot stack its seeds: {why}")
    setups, augment_generators = [], []
    for seed in seeds:
        setups.append(setup_seed(bench, training, run, seed, device))
        augment_generators.append(_global_generator_now(device))      # before the next seed's setup reseeds it
    if any(s.stream.bounds != setups[0].stream.bounds for s in setups):
        raise RuntimeError("stacked seeds need streams of the same batch sizes")   # the kinds guarantee it
    net = stack_networks([s.net for s in setups]).to(device)
    transform = SeedwiseTransform(setups[0].train_transform, augment_generators)
    lone = [s.method for s in setups]
    # no generator of its own: every draw of a stacked step is each seed's, through ctx.seeds
    ctx = dataclasses.replace(lone[0].ctx, train_transform=transform, generator=None,
                              seeds=Seeds([m.ctx.generator for m in lone], stacked=True))
    method = METHODS[run.algorithm](net, run, ctx)
    method.stack(lone)
    return StreamLoop(setups, method, transform, setups[0].has_tasks, device, setups[0].amp, augment_generators)


def _global_generator_now(device: torch.device) -> torch.Generator:
    """A generator on `device` in the state of torch's global generator there, now."""
    generator = torch.Generator(device)
    generator.set_state(torch.cuda.get_rng_state(device) if device.type == "cuda" else torch.get_rng_state())
    return generator
