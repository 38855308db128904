"""Training a job of a run's seeds (one seed alone, or a stacked group, gcl.training.stacking) through the one loop
(gcl.training.loop), each seed set up as it would be alone (gcl.training.seed); each seed's result."""
from __future__ import annotations

import time

import torch

from gcl.core.devices import environment
from gcl.core.results import SeedResult
from gcl.data.benchmarks import BenchmarkData, TrainingSettings
from gcl.methods.base import RunSettings
from gcl.training.checkpoint import Checkpoint
from gcl.training.loop import DivergenceError, SeedRecord
from gcl.training.progress import Progress, StreamProgress
from gcl.training.seed import SeedSetup, setup_seed
from gcl.training.stacking import stacked_loop


def train_seeds(bench: BenchmarkData, training: TrainingSettings, run: RunSettings, seeds: list[int],
                device: torch.device, feature_samples: dict[int, int] | None = None, progress: Progress | None = None,
                checkpoint: Checkpoint | None = None, compiled: str | None = None,
                stacked: bool = False) -> dict[int, SeedResult]:
    """Train `seeds` of `run` over the benchmark stream, one job: a lone seed, or (`stacked`) the seeds as one
    stacked group (gcl.training.stacking); each seed's result, as a lone seed's would be (setup_seed's arguments).

    `feature_samples`: per seed, the evaluation images whose final penultimate features its result keeps (for
    t-SNE; the caller stores them apart from the JSON). `progress` receives each seed's lines at every task end, at
    the end and at least every minute; with `checkpoint` (the job's) the job resumes from its saved state, if one
    with the same fingerprint exists, and saves it as it goes: at task ends and at least every
    `checkpoint_minutes`."""
    if not stacked and len(seeds) != 1:
        raise ValueError(f"seeds {seeds} train alone one at a time, or stacked")
    if stacked:
        loop = stacked_loop(bench, training, run, seeds, device)
    else:
        loop = setup_seed(bench, training, run, seeds[0], device, compiled).loop
    progress = progress or Progress(run.method, seed=None if stacked else seeds[0])
    saved = checkpoint.load(progress.say) if checkpoint else None
    if saved is not None:
        loop.restore(saved)
        who = f"seeds {seeds} " if stacked else ""
        progress.say(f"{who}resumed from {checkpoint.path} at step {loop.step} of {loop.stream.steps}")
    epochs = loop.setups[0].schedule.stream_epochs
    lines = [StreamProgress(progress.for_seed(seed) if stacked else progress, loop.stream, loop.has_tasks, epochs,
                            loop.step) for seed in seeds]
    scores = loop.run(lines, checkpoint)
    extra = {"stacked": len(seeds)} if stacked else {}
    return {s.seed: seed_result(s, record, score, bench, training, device, (feature_samples or {}).get(s.seed, 0),
                                **extra)
            for s, record, score in zip(loop.setups, loop.records, scores)}


def train_stacked(bench: BenchmarkData, training: TrainingSettings, run: RunSettings, seeds: list[int],
                  device: torch.device, feature_samples: dict[int, int] | None = None,
                  progress: Progress | None = None, checkpoint: Checkpoint | None = None) -> dict[int, SeedResult]:
    """`seeds` of `run` trained as one stacked group (train_seeds)."""
    return train_seeds(bench, training, run, seeds, device, feature_samples, progress, checkpoint, stacked=True)


def run_seed(bench: BenchmarkData, training: TrainingSettings, run: RunSettings, seed: int, device: torch.device,
             feature_samples: int = 0, progress: Progress | None = None, checkpoint: Checkpoint | None = None,
             compiled: str | None = None) -> SeedResult:
    """One seed trained alone (train_seeds)."""
    return train_seeds(bench, training, run, [seed], device, {seed: feature_samples}, progress, checkpoint,
                       compiled)[seed]


def seed_result(s: SeedSetup, record: SeedRecord, scores: dict, bench: BenchmarkData, training: TrainingSettings,
                device: torch.device, feature_samples: int = 0, **environment_extra) -> SeedResult:
    """A trained seed's result: its scores (summarise's), with the final network's confusion matrix, its method's
    own metrics and (`feature_samples` > 0) features for the t-SNE, after the collapse check. `s.method` holds the
    seed's final state (a stacked seed's copied back by the loop's last evaluation)."""
    net, method, evaluate = s.net, s.method, s.evaluate
    started = time.perf_counter()
    with s.amp():
        net.eval()
        confusion = record.final_confusion or evaluate.confusion(method.predict)
        if evaluate.features_collapsed(method.features):
            raise DivergenceError("the trained network gives every evaluation image the same features (a collapsed "
                                  "network, e.g. all-zero after dead ReLUs), so it predicts one class for everything: "
                                  "the learning rate or a loss weight is probably too high")
        method_metrics = method.extra_metrics()
        features = evaluate.features(method.features, feature_samples) if feature_samples else None
    if scores.get("eval_seconds") is not None:
        scores = scores | {"eval_seconds": scores["eval_seconds"] + time.perf_counter() - started}
    # the memory layout changes a convolution's rounding, not its arithmetic: recorded where it is not the default
    layout = {"layout": "channels_last"} if training.channels_last else {}
    return SeedResult(**scores, confusion=confusion, method_metrics=method_metrics,
                      environment=environment(device, training.bf16, net.compile_mode) | layout | environment_extra,
                      features=features)


