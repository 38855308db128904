"""A run's seeds trained stacked: one network for S seeds (gcl.core.stacked), one step for all of them.

Each seed is set up exactly as it is alone (setup_seed: its generator, its stream, its network's initial weights, its
method's state, its evaluator), then its network joins the stacked one and its method's state the stacked method's:
the same method class, whose step is written over the seed axis (gcl.core.seeds). Every seed's stream has the same
batch sizes (they follow from the class counts, not from the draw), so step k takes batch k of every seed's own
stream. At each evaluation point every seed's weights are copied back into its own network and scored by its own
evaluator, and each seed's result is made as a lone seed's is (seed_result), recording `stacked`: how many seeds
trained together. In float64 a stacked seed equals its lone run to rounding (tests/test_stacked_train.py); in float32
the batched and the lone kernels round differently, so the two paths agree in distribution, each deterministic on one
machine.

A seed's augmentation draws from the global generator when it trains alone, and nothing else of a stackable method's
step does (their draws come from the run's own generator, ctx.generator); so each stacked seed takes, right after its
setup, a generator in the state the global one would start its training with, and draws its crops and flips from it
(gcl.data.augment.SeedwiseTransform).

Stacks: every method whose `trains_alone` is None, on the MLP and the ResNet-18, eager, fp32 (or the default float
type); `unstackable` says why another run does not."""
from __future__ import annotations

import dataclasses

import torch

from gcl.core.results import SeedResult
from gcl.core.seeds import Seeds
from gcl.core.stacked_resnet import stack_networks
from gcl.data.augment import SeedwiseTransform
from gcl.data.benchmarks import BenchmarkData, TrainingSettings
from gcl.data.stream import Stream
from gcl.methods import METHODS
from gcl.methods.base import Method, RunSettings
from gcl.training.checkpoint import Checkpoint, restore_rng_states, rng_states
from gcl.training.compilation import may_compile
from gcl.training.evaluate import summarise
from gcl.training.loop import DivergenceError, Timer, last_accuracy
from gcl.training.progress import Progress, StreamProgress
from gcl.training.train import seed_result, setup_seed


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
    where it stacks and stacking is measured to pay, i.e. on the MLP (docs/performance.md: a stacked ResNet-18 step
    was slower than lone ones on a CPU, and on a GPU a compiled run, auto there, does not stack)."""
    if seeds < 2 or training.stack is False or unstackable(training, run) is not None:
        return False
    return training.stack is True or training.backbone == "mlp"


def train_stacked(bench: BenchmarkData, training: TrainingSettings, run: RunSettings, seeds: list[int],
                  device: torch.device, feature_samples: dict[int, int] | None = None,
                  progress: Progress | None = None, checkpoint: Checkpoint | None = None) -> dict[int, SeedResult]:
    """Train `seeds` of `run` as one stacked network; each seed's result, as run_seed would give it alone
    (`feature_samples`: per seed, the evaluation images whose final features its result keeps). Each seed's
    progress lines are a lone seed's: at each task end, at the end, and at least every minute. With `checkpoint`
    (one for the group) the group resumes from its saved state, if one with the same fingerprint exists, and saves
    it as a lone seed does: at task ends and at least every `checkpoint_minutes`."""
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
    lone = [s.method for s in setups]
    # no generator of its own: every draw of a stacked step is each seed's, through ctx.seeds
    ctx = dataclasses.replace(lone[0].ctx, train_transform=transform, generator=None,
                              seeds=Seeds([m.ctx.generator for m in lone], stacked=True))
    method = METHODS[run.algorithm](net, run, ctx)
    method.stack(lone)
    pool = GroupPool(streams, device)
    orders = torch.stack([st.order for st in streams]).to(device)   # (S, samples)
    eval_after, task_ends = set(stream.eval_after), set(stream.task_ends)
    has_tasks = setups[0].loop.has_tasks
    progress = progress or Progress(run.method)
    group = _GroupState(method, setups, augment_generators, device)
    saved = checkpoint.load(progress.say) if checkpoint else None
    if saved is not None:
        group.restore(saved)
        progress.say(f"seeds {seeds} resumed from {checkpoint.path} at step {group.step} of {stream.steps}")
    lines = [StreamProgress(progress.for_seed(seed), stream, has_tasks, setups[0].schedule.stream_epochs, group.step)
             for seed in seeds]
    losses = group.losses
    timer = Timer(device)          # the training steps only, as a lone seed's (evaluations left out)
    timer.start()
    for step in range(group.step, stream.steps):
        x_raw, y = pool.batch(orders[:, stream.bounds[step]:stream.bounds[step + 1]])
        group.loss_sum += method.observe(transform(x_raw), y, x_raw)
        group.loss_steps += 1
        if step in eval_after:
            timer.stop()
            _check_finite(group.loss_sum, net, seeds, step, stream.steps)
            for s, setup in enumerate(setups):
                losses[s].append(float(group.loss_sum[s]) / group.loss_steps)
                method.unstack(s, setup.method)      # its network and what else it evaluates with (CLS-ER's memories)
                setup.loop.evaluate_now()
            group.loss_sum.zero_()
            group.loss_steps = 0
            timer.start()
        group.step = step + 1
        task_ended = step in task_ends
        if task_ended or step == stream.steps - 1 or lines[0].due():
            for line, setup in zip(lines, setups):
                line.report(step, last_accuracy(setup.loop.rows, has_tasks))
        if checkpoint is not None and group.step < stream.steps and \
                checkpoint.due(task_ended and setups[0].schedule.checkpoint_at_task_ends):
            timer.stop()
            checkpoint.save(group.state(seconds=group.seconds + timer.total))
            timer.start()
    method.finish()                # JOINT trains here, inside the timer as the lone loop times it
    timer.stop()
    _check_finite(group.loss_sum, net, seeds, stream.steps - 1, stream.steps)
    seconds = (group.seconds + timer.total) / n                      # each seed's share of the stacked time
    results = {}
    for s, (seed, setup) in enumerate(zip(seeds, setups)):
        method.unstack(s, setup.method)
        if not setup.loop.rows:
            setup.loop.evaluate_now()
        scores = summarise(setup.loop.rows, losses[s], setup.loop.has_tasks, stream.steps, stream.n_samples, seconds)
        results[seed] = seed_result(setup, scores, bench, training, device, (feature_samples or {}).get(seed, 0),
                                    stacked=n)
    return results


class GroupPool:
    """A stacked group's training images and labels on the device: one copy where every seed's stream holds the
    same pool (a sequential benchmark's: each seed only orders it its own way), else each seed's own pool, stacked
    (MNIST-360's, rotated by each seed's draws). So a group on Tiny ImageNet holds its 1.2 GB once, not once a seed."""

    def __init__(self, streams: list[Stream], device: torch.device):
        first = streams[0]
        self.shared = all(st.images is first.images and st.labels is first.labels for st in streams)
        if self.shared:
            self.images, self.labels = first.images.to(device), first.labels.to(device)
        else:
            self.images = torch.stack([st.images for st in streams]).to(device)       # (S, pool, ...)
            self.labels = torch.stack([st.labels for st in streams]).to(device)
            self.rows = torch.arange(len(streams), device=device).unsqueeze(1)

    def batch(self, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Each seed's images and labels at its pool indices `idx` (S, B): (S, B, ...) and (S, B)."""
        if self.shared:
            return self.images[idx], self.labels[idx]
        return self.images[self.rows, idx], self.labels[self.rows, idx]


class _GroupState:
    """A stacked group's position and bookkeeping (the next step, each seed's loss curve and evaluation rows, the
    loss sums since the last evaluation), which with the stacked method's state and every random state the group
    draws from (each seed's run and augmentation generators, Python's, NumPy's and torch's) make its checkpoint."""

    def __init__(self, method: Method, setups: list, augment_generators: list[torch.Generator],
                 device: torch.device):
        self.method, self.setups, self.augment_generators, self.device = method, setups, augment_generators, device
        self.step, self.seconds = 0, 0.0         # the next step to run; training time of earlier attempts
        self.losses: list[list[float]] = [[] for _ in setups]
        self.loss_sum, self.loss_steps = torch.zeros(len(setups), device=device), 0

    def state(self, seconds: float) -> dict:
        """What the group's checkpoint holds; `seconds`: the training time of this and earlier attempts."""
        generators = self.method.seeds.generators
        return {"loop": {"step": self.step, "losses": self.losses, "rows": [s.loop.rows for s in self.setups],
                         "loss_sum": self.loss_sum.cpu(), "loss_steps": self.loss_steps, "seconds": seconds},
                "method": self.method.state_dict(),
                "rng": {"global": rng_states(generators[0], self.device),
                        "runs": [g.get_state() for g in generators],
                        "augment": [g.get_state() for g in self.augment_generators]}}

    def restore(self, saved: dict) -> None:
        loop, rng = saved["loop"], saved["rng"]
        if len(loop["rows"]) != len(self.setups):
            raise ValueError(f"a checkpoint of {len(loop['rows'])} stacked seeds does not fit {len(self.setups)}")
        self.step, self.seconds, self.losses = loop["step"], loop["seconds"], loop["losses"]
        self.loss_sum, self.loss_steps = loop["loss_sum"].to(self.device), loop["loss_steps"]
        for setup, rows in zip(self.setups, loop["rows"]):
            setup.loop.rows = rows
        self.method.load_state_dict(saved["method"])
        generators = self.method.seeds.generators
        restore_rng_states(rng["global"], generators[0], self.device)
        for g, state in zip([*generators, *self.augment_generators], [*rng["runs"], *rng["augment"]]):
            g.set_state(state)


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
