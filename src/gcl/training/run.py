"""One run (one table cell: a benchmark, a method, a buffer): train every seed and aggregate.

Each finished seed is saved under .gcl-progress/ (gcl.core.progress_files) with a fingerprint of its settings,
of the benchmark file and of the code train stages run (gcl.core.layout.TRAIN_CODE), and each unfinished one keeps
a checkpoint there (gcl.training.checkpoint; seeds trained stacked, one for their group), so a run that was
interrupted goes on where it stopped; the folder is
removed once the run's metrics.json is written. Progress lines go to stdout and to the run's train.log.
"""
from __future__ import annotations

import functools
import json
import multiprocessing
import shutil
import statistics
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch

from gcl.core.atomic import move_file, remove_stale_temporaries, save_tensors, write_json
from gcl.core.devices import (
    auto_workers,
    compile_threads,
    resolve_device,
    seed_devices,
    share_compile_threads,
    stacked_groups,
    start_mps,
)
from gcl.core.fingerprint import file_digest, fingerprint
from gcl.core.layout import benchmark_file, run_dir, run_log
from gcl.core.processes import RunLock, die_with_parent
from gcl.core.progress_files import run_lock_path, run_progress_dir
from gcl.core.results import RunResult, SeedResult
from gcl.data.benchmarks import DataSettings, load_benchmark
from gcl.methods import METHODS
from gcl.training.checkpoint import Checkpoint, load_fingerprinted
from gcl.training.compilation import compile_mode
from gcl.training.loop import DivergenceError
from gcl.training.progress import Progress
from gcl.training.spec import ResolvedRun
from gcl.training.stacking import stacks, unstackable
from gcl.training.train import train_seeds

FEATURE_SAMPLES = 1000   # evaluation images whose final features are kept (first seed) for t-SNE


def mean_std(values: list[float | None]) -> tuple[float | None, float | None]:
    values = [v for v in values if v is not None]
    if not values:
        return None, None
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


@functools.lru_cache(maxsize=1)
def _loaded_benchmark(bench_path: str, digest: str, data: DataSettings) -> dict:
    """A process's benchmark, loaded once however many seeds it trains (keyed by the file's digest too: a test may
    write another file at the same relative path)."""
    return load_benchmark(bench_path, data)


def _worker_setup(spec: ResolvedRun, bench_path: str, digest: str, device: str, threads: int) -> tuple:
    """What a worker (or this process) sets before it trains: its threads, its device, the benchmark (loaded once)."""
    torch.set_num_threads(threads)
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    return device, _loaded_benchmark(bench_path, digest, spec.data)


def _train_job(spec: ResolvedRun, bench_path: str, digest: str, seeds: list[int], stacked: bool, device: str,
               compiled: str | None, feature_samples: dict[int, int], threads: int, progress: Progress,
               checkpoint: Checkpoint) -> dict[int, SeedResult]:
    """One job, in a worker process or in this one: a seed alone, or seeds trained stacked; the same numbers either
    way (every RNG is seeded per seed). `compiled`: the run's compile mode; `feature_samples` per seed; `checkpoint`
    the job's. A divergence names the run and the seed."""
    device, bench = _worker_setup(spec, bench_path, digest, device, threads)
    if stacked:
        progress.say(f"seeds {seeds} train stacked, as one network")
    try:
        return train_seeds(bench, spec.benchmark, spec.run, seeds, device, feature_samples, progress, checkpoint,
                           compiled, stacked)
    except DivergenceError as exc:
        raise DivergenceError(f"run {spec.key}{'' if stacked else f', seed {seeds[0]}'}: {exc}") from None


def groups_of(items: list, n: int) -> list[list]:
    """`items` in `n` contiguous groups as even as can be (the first ones one longer)."""
    n = max(1, min(n, len(items)))
    size, extra = divmod(len(items), n)
    out, start = [], 0
    for g in range(n):
        end = start + size + (g < extra)
        out.append(items[start:end])
        start = end
    return out


def start_worker(compile_threads: int) -> None:
    """A seed worker's first act: it dies with its parent, and torch.compile compiles kernels with its share of
    the cores (16 workers on 16 cores would otherwise start 256 compiler processes)."""
    die_with_parent()
    share_compile_threads(compile_threads)


class InProcess:
    """An executor for one worker: each call runs in this process when its result is asked for, so that seeds
    run (and are saved) one after the other, in the order they were submitted."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def submit(self, fn, *args, **kwargs):
        return _Deferred(functools.partial(fn, *args, **kwargs))


@dataclass
class _Deferred:
    call: Callable

    def result(self):
        return self.call()


def pool_start_method(device_type: str) -> str:
    """How seed workers start: fork in milliseconds on a CPU (the parent has run no torch op yet); CUDA needs spawn,
    which starts each worker as a fresh interpreter that imports what it runs."""
    return "fork" if device_type == "cpu" else "spawn"


def train_run(spec: ResolvedRun, workers: int | str = 1, threads: int = 1, checkpoint_minutes: float = 10.0,
              mps: str = "off") -> Path:
    """Every seed of the resolved run `spec` (gcl.config.resolve_run); `workers` processes side by side (or
    "auto", gcl.core.devices.auto_workers), `threads` CPU threads each, a checkpoint at least every
    `checkpoint_minutes`; with `mps` "auto", NVIDIA's MPS is started when several processes share a GPU
    (none of these changes the numbers). One process at a time per run."""
    with RunLock(run_lock_path(spec.key), spec.key):
        return _train_run(spec, workers, threads, checkpoint_minutes, mps)


def _train_run(spec: ResolvedRun, workers: int | str, threads: int, checkpoint_minutes: float, mps: str) -> Path:
    key, run, training = spec.key, spec.run, spec.benchmark
    device = resolve_device(spec.device)      # a bad device stops here, before any training
    torch.set_num_threads(threads)
    bench_path = str(benchmark_file(run.benchmark))
    progress = run_progress_dir(key)
    features = progress / "features.pt"
    out_dir = run_dir(run)
    remove_stale_temporaries(out_dir)     # left by a killed write; DVC restores the outputs themselves
    log = Progress(key, run_log(run))
    log.log.unlink(missing_ok=True)
    data_digest = file_digest(bench_path)   # the benchmark's bytes, read once for every seed
    run_json, training_json = run.model_dump(mode="json"), training.model_dump(mode="json")

    # the run's compile mode, decided here once: every seed's fingerprint records it (`auto` may compile on one
    # machine and not on another) and every seed applies it
    compiled = compile_mode(training.compile, device, METHODS[run.algorithm])
    # the stacked groups, from every seed of the run (not the ones left to train), so that a resumed run groups as its
    # first attempt did; a seed's fingerprint says whether it was stacked (in float32 it rounds otherwise than alone)
    workers = auto_workers(device, len(spec.seeds)) if workers == "auto" else workers
    why_alone: list[str] = []     # said after the run's first line
    groups = stacked_seed_groups(spec, compiled, workers, device, threads, why_alone.append)
    stacked = {seed for group in groups for seed in group}
    prints, seeds, todo = {}, {}, {}
    for i, seed in enumerate(spec.seeds):
        prints[seed] = fingerprint(run_json, training_json, seed, device.type, data_digest, compiled,
                                   *(["stacked"] if seed in stacked else []))
        done = progress / f"seed-{seed}-{prints[seed]}.json"
        say = log.for_seed(seed).say
        earlier = _earlier_result(done, say)
        if earlier is not None and (i > 0 or load_fingerprinted(features, prints[seed], say, "features file",
                                                                "the first seed trains again") is not None):
            # finished by an earlier, interrupted attempt with these exact settings and code
            seeds[seed] = earlier
            say(f"finished by an earlier attempt: reused from {done}")
        else:
            checkpoint = Checkpoint(progress / f"seed-{seed}.ckpt", prints[seed], 60.0 * checkpoint_minutes)
            todo[seed] = (done, FEATURE_SAMPLES if i == 0 else 0, checkpoint)

    def finished(seed: int, r: SeedResult) -> None:
        done, _, checkpoint = todo[seed]
        if r.features is not None:   # the first seed's final features, for the t-SNE figures, with its fingerprint
            save_tensors(features, {"seed": seed, "fingerprint": checkpoint.fingerprint, **r.features})
        write_json(done, r.to_json())
        checkpoint.discard()
        seeds[seed] = r
        log.for_seed(seed).say(f"done: class-il {r.class_il:.2f} in {r.train_seconds:.1f}s "
                               f"({r.samples_per_second:.0f} samples/s)")

    # a group trains whole, or not at all (its seeds finish together); the other seeds train alone
    jobs = [g for g in groups if any(seed in todo for seed in g)] + [[seed] for seed in todo if seed not in stacked]
    workers = max(1, min(workers, len(jobs)))
    devices = seed_devices(device, len(jobs))   # on several visible GPUs, the jobs take turns over them
    if mps == "auto" and device.type == "cuda" and workers > len(set(devices)):   # processes share a GPU
        start_mps(log.say)
    log.say(f"{len(todo)} seed(s) to train on {', '.join(sorted(set(map(str, devices)))) or device}, "
            f"{workers} process(es)")
    for line in why_alone:
        log.say(line)
    if workers > 1:   # seeds are independent: spread them over processes (CPU cores, or GPUs)
        context = multiprocessing.get_context(pool_start_method(device.type))
        executor = ProcessPoolExecutor(workers, mp_context=context, initializer=start_worker,
                                       initargs=(compile_threads(workers),))
    else:
        executor = InProcess()
    with executor as pool:
        submitted = []
        for job, dev in zip(jobs, devices):
            together = job[0] in stacked
            ckpt = group_checkpoint(progress, job, prints, checkpoint_minutes) if together else todo[job[0]][2]
            samples = {seed: todo[seed][1] if seed in todo else 0 for seed in job}
            submitted.append((job, ckpt, pool.submit(_train_job, spec, bench_path, data_digest, job, together, str(dev),
                                                     None if together else compiled, samples, threads,
                                                     log if together else log.for_seed(job[0]), ckpt)))
        for job, ckpt, future in submitted:
            results = future.result()
            for seed in job:
                if seed in todo:        # a seed of a group finished before keeps its saved result
                    finished(seed, results[seed])
            ckpt.discard()
    seeds = {s: seeds[s] for s in spec.seeds}

    stats = {m: mean_std([getattr(r, m) for r in seeds.values()]) for m in ("class_il", "task_il", "forgetting")}
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / "metrics.json"
    result = RunResult(benchmark=run.benchmark, method=run.method, buffer=run.buffer,
                       device=device.type, torch=torch.__version__, threads=torch.get_num_threads(), workers=workers,
                       config={"run": run_json, "benchmark": training_json}, seeds=seeds,
                       mean={m: v[0] for m, v in stats.items()}, std={m: v[1] for m, v in stats.items()})
    write_json(out, result.to_json())
    # moved only once metrics.json is written: if that fails, a rerun still finds every seed's result here
    move_file(features, out_dir / "features.pt")   # .gcl-progress may be on another file system (a link to scratch)
    # the cell is complete: a later forced run must train again, not reuse these seeds
    shutil.rmtree(progress, ignore_errors=True)
    return out


def group_checkpoint(progress: Path, seeds: list[int], prints: dict[int, str], checkpoint_minutes: float) -> Checkpoint:
    """The checkpoint of the stacked group of `seeds` (`prints`: each seed's fingerprint): named by its seeds, its
    fingerprint theirs together, so that only the same seeds, with the same settings, data and code, resume it."""
    return Checkpoint(progress / f"group-{'-'.join(map(str, seeds))}.ckpt",
                      fingerprint(*[prints[seed] for seed in seeds]), 60.0 * checkpoint_minutes, "group")


def stacked_seed_groups(spec: ResolvedRun, compiled: str | None, workers: int, device: torch.device, threads: int,
                        say: Callable[[str], None]) -> list[list[int]]:
    """The groups of the run's seeds that train stacked, one process each (a seed in none trains alone), from the
    settings, the seed count, `workers` and the cores (gcl.core.devices.stacked_groups). `stack: true` stacks every
    seed, in stacks of one too where the cores leave a seed alone in its process; `auto` makes no stack of one
    (it would batch nothing and round otherwise than alone): such a seed trains alone. `say` tells why seeds
    that `auto` would stack train alone."""
    training, run, seeds = spec.benchmark, spec.run, list(spec.seeds)
    why = unstackable(training, run)
    if why is not None and len(seeds) > 1 and training.stack is not False:
        say(f"seeds train alone: {why}")
    if not stacks(training, run, len(seeds)):
        return []
    if compiled is not None:      # check@runs refuses stack: true where compile: auto may compile
        say(f"seeds train alone: compile: {training.compile} compiles this run ({compiled}), and compiled seeds do "
            "not stack; the benchmark's compile: false stacks them")
        return []
    groups = [g for g in groups_of(seeds, stacked_groups(workers, device, threads)) if g]
    if training.stack is True:
        return groups
    alone = [g[0] for g in groups if len(g) == 1]
    if alone:
        say(f"seed(s) {alone} train alone: stack: auto makes no stack of one ({len(seeds)} seeds in {len(groups)} "
            f"process(es); fewer workers stack more of them)")
    return [g for g in groups if len(g) > 1]


def _earlier_result(done: Path, say) -> SeedResult | None:
    """A seed's result saved by an earlier attempt, or None; one that cannot be read (truncated by a full disk,
    say) is refused in one line and deleted, and the seed trains again."""
    if not done.exists():
        return None
    try:
        return SeedResult.from_json(json.loads(done.read_text()))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, TypeError) as exc:
        say(f"{done} refused: it cannot be read ({type(exc).__name__}: {exc}); it is deleted and the seed trains again")
        done.unlink(missing_ok=True)
        return None
