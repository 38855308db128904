"""A run's seeds trained stacked: one network for S seeds (gcl.core.stacked), one step for all of them.

Each seed is set up exactly as it is alone (setup_seed: its generator, its stream, its network's initial weights,
its evaluator), then its network joins the stacked one and its method's step the stacked method's
(gcl.methods.stacked). Every seed's stream has the same batch sizes (they follow from the class counts, not from
the draw), so step k takes batch k of every seed's own stream. At each evaluation point every seed's weights are
copied back into its own network and scored by its own evaluator, and each seed's result is made as a lone
seed's is (seed_result), recording `stacked`: how many seeds trained together. In float64 a stacked seed equals
its lone run to rounding (tests/test_stacked_train.py); in float32 the batched and the lone kernels round
differently, so the two paths agree in distribution, each deterministic on one machine.

A seed's augmentation draws from the global generator when it trains alone, and nothing else of a stackable
method's step does (their draws come from the run's own generator, ctx.generator); so each stacked seed takes,
right after its setup, a generator in the state the global one would start its training with, and draws its
crops and flips from it (gcl.data.augment.SeedwiseTransform).

Stacks so far: the methods of gcl.methods.stacked.STACKED on the MLP and the ResNet-18, eager, fp32 (or the
default float type); `unstackable` says why another run does not.
"""
from __future__ import annotations

import torch

from gcl.core.results import SeedResult
from gcl.core.stacked_resnet import stack_networks
from gcl.data.augment import SeedwiseTransform
from gcl.data.benchmarks import BenchmarkData, TrainingSettings
from gcl.methods.base import RunSettings
from gcl.methods.stacked import STACKED
from gcl.training.evaluate import summarise
from gcl.training.progress import Progress, StreamProgress
from gcl.training.train import DivergenceError, Timer, last_accuracy, seed_result, setup_seed


def unstackable(training: TrainingSettings, run: RunSettings) -> str | None:
    """Why the seeds of this run cannot train stacked (None: they can), whatever its `stack` setting says."""
    if run.algorithm not in STACKED:
        return f"{run.algorithm}'s step does not stack (yet)"
    if training.backbone == "mlp" and training.input_size is not None:
        return "a stacked MLP takes its input as it is (input_size: none)"
    if training.bf16 or training.compile is True:
        return "the stacked step runs eager in full precision"
    if training.channels_last:
        return "a stacked ResNet-18 keeps the default memory layout"
    return None


def stacks(training: TrainingSettings, run: RunSettings, seeds: int) -> bool:
    """Whether `seeds` seeds of this run train stacked (never one seed): `stack` true where the run stacks, or auto
    where it stacks and stacking is measured to pay, i.e. on the MLP (docs/performance.md: a stacked ResNet-18 step
    was slower than lone ones on a CPU, and on a GPU a compiled run, auto there, does not stack)."""
    if seeds < 2 or training.stack is False or unstackable(training, run) is not None:
        return False
    return training.stack is True or training.backbone == "mlp"


def train_stacked(bench: BenchmarkData, training: TrainingSettings, run: RunSettings, seeds: list[int],
                  device: torch.device, feature_samples: dict[int, int] | None = None,
                  progress: Progress | None = None) -> dict[int, SeedResult]:
    """Train `seeds` of `run` as one stacked network; each seed's result, as run_seed would give it alone
    (`feature_samples`: per seed, the evaluation images whose final features its result keeps). Each seed's
    progress lines are a lone seed's: at each task end, at the end, and at least every minute."""
    why = unstackable(training, run)
    if why is not None:
        raise ValueError(f"{run.method}: cannot stack its seeds: {why}")
    setups, augment_generators = [], []
    for seed in seeds:
        setups.append(setup_seed(bench, training, run, seed, device))
        augment_generators.append(_global_generator_now(device))      # before the next seed's setup reseeds it
    streams = [s.stream for s in setups]
    if any(st.bounds != streams[0].bounds for st in streams):
        raise RuntimeError("stacked seeds need streams of the same batch sizes")   # the kinds guarantee it
    stream, n = streams[0], len(seeds)
    net = stack_networks([s.net for s in setups]).to(device)
    transform = SeedwiseTransform(setups[0].loop.train_transform, augment_generators)
    method = STACKED[run.algorithm](net, run, [s.method for s in setups], transform)
    pools = torch.stack([s.loop.pool for s in setups])              # (S, pool, ...): each seed's own images
    labels = torch.stack([s.loop.labels for s in setups])
    orders = torch.stack([st.order for st in streams]).to(device)   # (S, samples)
    rows = torch.arange(n, device=device).unsqueeze(1)
    eval_after, task_ends = set(stream.eval_after), set(stream.task_ends)
    has_tasks = setups[0].loop.has_tasks
    progress = progress or Progress(run.method)
    lines = [StreamProgress(progress.for_seed(seed), stream, has_tasks, setups[0].schedule.stream_epochs, 0)
             for seed in seeds]
    losses = [[] for _ in seeds]
    loss_sum, loss_steps = torch.zeros(n, device=device), 0
    timer = Timer(device)          # the training steps only, as a lone seed's (evaluations left out)
    timer.start()
    for step in range(stream.steps):
        idx = orders[:, stream.bounds[step]:stream.bounds[step + 1]]
        x_raw, y = pools[rows, idx], labels[rows, idx]
        loss_sum += method.observe(transform(x_raw), y, x_raw)
        loss_steps += 1
        if step in eval_after:
            timer.stop()
            _check_finite(loss_sum, net, seeds, step, stream.steps)
            for s, setup in enumerate(setups):
                losses[s].append(float(loss_sum[s]) / loss_steps)
                net.unstack(s, setup.net)
                method.unstack(s, setup.method)      # what the lone method evaluates with (CLS-ER's memories)
                setup.loop.evaluate_now()
            loss_sum.zero_()
            loss_steps = 0
            timer.start()
        if step in task_ends or step == stream.steps - 1 or lines[0].due():
            for line, setup in zip(lines, setups):
                line.report(step, last_accuracy(setup.loop.rows, has_tasks))
    method.finish()                # JOINT trains here, inside the timer as the lone loop times it
    timer.stop()
    _check_finite(loss_sum, net, seeds, stream.steps - 1, stream.steps)
    seconds = timer.total / n                                        # each seed's share of the stacked time
    results = {}
    for s, (seed, setup) in enumerate(zip(seeds, setups)):
        net.unstack(s, setup.net)
        method.unstack(s, setup.method)
        if not setup.loop.rows:
            setup.loop.evaluate_now()
        scores = summarise(setup.loop.rows, losses[s], setup.loop.has_tasks, stream.steps, stream.n_samples, seconds)
        results[seed] = seed_result(setup, scores, bench, training, device, (feature_samples or {}).get(seed, 0),
                                    stacked=n)
    return results


def _global_generator_now(device: torch.device) -> torch.Generator:
    """A generator on `device` in the state of torch's global generator there, now."""
    generator = torch.Generator(device)
    generator.set_state(torch.cuda.get_rng_state(device) if device.type == "cuda" else torch.get_rng_state())
    return generator


def _check_finite(loss_sum: torch.Tensor, net: torch.nn.Module, seeds: list[int], step: int, steps: int) -> None:
    """Refuse a seed whose loss or weights stopped being finite, naming it (one host synchronisation)."""
    finite = torch.isfinite(loss_sum)
    for p in net.parameters():
        finite &= torch.isfinite(p.flatten(1)).all(1)
    bad = [seed for seed, ok in zip(seeds, finite.tolist()) if not ok]
    if bad:
        raise DivergenceError(f"seed(s) {bad}: the loss or the network's parameters became non-finite by step {step} "
                              f"of {steps}: the learning rate or a loss weight is probably too high")
