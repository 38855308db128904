"""One run (one table cell: a benchmark, a method, a buffer): train every seed and aggregate.

Each finished seed is saved under .gcl-progress/ with a fingerprint of its settings, of the
benchmark file and of the library's code, so a run that was interrupted resumes with the seeds it
had finished; the folder is removed once the run's metrics.json is written.
"""
from __future__ import annotations

import json
import multiprocessing
import shutil
import statistics
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch

from gcl.atomic import remove_stale_temporaries, save_tensors, write_json
from gcl.data.benchmarks import load_benchmark
from gcl.fingerprint import fingerprint
from gcl.layout import benchmark_file, run_dir
from gcl.processes import RunLock, die_with_parent
from gcl.train import DivergenceError, resolve_device, run_seed

PROGRESS_DIR = Path(".gcl-progress")
FEATURE_SAMPLES = 1000   # evaluation images whose final features are kept (first seed) for t-SNE


def mean_std(values: list[float | None]) -> tuple[float | None, float | None]:
    values = [v for v in values if v is not None]
    if not values:
        return None, None
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def _seed_in_worker(bench_path: str, data_cfg: dict, bench_cfg: dict, run_cfg: dict, seed: int, device: str,
                    feature_samples: int, threads: int) -> dict:
    """One seed in a fresh process: the same numbers as in the parent (every RNG is seeded per run)."""
    torch.set_num_threads(threads)
    bench = load_benchmark(bench_path, data_cfg)
    return run_seed(bench, bench_cfg, run_cfg, seed, torch.device(device), feature_samples)


def train_run(spec: dict, workers: int = 1, threads: int = 1) -> Path:
    """Every seed of the resolved run `spec` (gcl.config.resolve_run); `workers` processes side by side,
    `threads` CPU threads each (neither changes the numbers). One process at a time per run."""
    with RunLock(PROGRESS_DIR / f"{spec['key']}.lock", spec["key"]):
        return _train_run(spec, workers, threads)


def _seed(key: str, seed: int, train, *args, **kwargs) -> dict:
    """One seed; a divergence names the run and the seed."""
    try:
        return train(*args, **kwargs)
    except DivergenceError as exc:
        raise DivergenceError(f"run {key}, seed {seed}: {exc}") from None


def _train_run(spec: dict, workers: int, threads: int) -> Path:
    key, run_cfg, bench_cfg = spec["key"], spec["run"], spec["benchmark"]
    device = resolve_device(spec["device"])
    torch.set_num_threads(threads)
    bench_path = str(benchmark_file(run_cfg["benchmark"]))
    progress = PROGRESS_DIR / key
    features = progress / "features.pt"
    out_dir = run_dir(run_cfg)
    remove_stale_temporaries(out_dir)     # left by a killed write; DVC restores the outputs themselves
    data_fingerprint = fingerprint(files=(bench_path,))

    seeds, todo = {}, []
    for i, seed in enumerate(spec["seeds"]):
        done = progress / f"seed-{seed}-{fingerprint(run_cfg, bench_cfg, seed, device.type, data_fingerprint)}.json"
        if done.exists() and (i > 0 or features.exists()):
            # finished by an earlier, interrupted attempt with these exact settings and code
            seeds[str(seed)] = json.loads(done.read_text())
            print(f"{key}: seed {seed} reused from {done}")
        else:
            todo.append((seed, done, FEATURE_SAMPLES if i == 0 else 0))

    def finished(seed, done, r):
        if "features" in r:  # the first seed's final features, for the t-SNE figures
            save_tensors(features, {"seed": seed, **r.pop("features")})
        write_json(done, r)
        seeds[str(seed)] = r
        print(f"{key}: seed {seed} class-il {r['class_il']:.2f} in {r['train_seconds']:.1f}s "
              f"({r['samples_per_second']:.0f} samples/s)", flush=True)

    workers = min(workers, len(todo))
    if workers > 1:   # seeds are independent: spread them over processes (CPU cores, or one GPU)
        # fork starts a worker in milliseconds (the parent has run no torch op yet); CUDA needs spawn
        context = multiprocessing.get_context("fork" if device.type == "cpu" else "spawn")
        with ProcessPoolExecutor(workers, mp_context=context, initializer=die_with_parent) as pool:
            jobs = [(seed, done, pool.submit(_seed, key, seed, _seed_in_worker, bench_path, spec["data"], bench_cfg,
                                             run_cfg, seed, device.type, n, threads))
                    for seed, done, n in todo]
            for seed, done, job in jobs:
                finished(seed, done, job.result())
    elif todo:
        bench = load_benchmark(bench_path, spec["data"])
        for seed, done, n in todo:
            finished(seed, done, _seed(key, seed, run_seed, bench, bench_cfg, run_cfg, seed, device, feature_samples=n))
    seeds = {str(s): seeds[str(s)] for s in spec["seeds"]}

    stats = {m: mean_std([s[m] for s in seeds.values()]) for m in ("class_il", "task_il", "forgetting")}
    out_dir.mkdir(parents=True, exist_ok=True)
    features.replace(out_dir / "features.pt")
    out = out_dir / "metrics.json"
    write_json(out, {
        "benchmark": run_cfg["benchmark"], "method": run_cfg["method"], "buffer": run_cfg["buffer"],
        "device": device.type, "torch": torch.__version__, "threads": torch.get_num_threads(),
        "workers": workers,
        "config": {"run": run_cfg, "benchmark": bench_cfg},
        "seeds": seeds,
        "mean": {m: v[0] for m, v in stats.items()},
        "std": {m: v[1] for m, v in stats.items()},
    })
    # the cell is complete: a later forced run must train again, not reuse these seeds
    shutil.rmtree(progress, ignore_errors=True)
    return out
