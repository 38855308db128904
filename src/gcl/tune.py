"""Choose hyperparameters on a validation split held out from the training stream; the test set is never read.

    python -m gcl.tune mnist-360-coca-500 --grid lr=0.1,0.2 lambda1=0.2,0.5,1.0 --seeds 0 1
    python -m gcl.tune seq-mnist-er-200 --grid lr=0.03,0.1 --fraction 0.1

The run's settings come from params.yaml (resolved as the train stage resolves them); every point of the
grid overrides some of them. The benchmark is rebuilt in memory with `validation_fraction` of each
class's training images held out (the stream is built from the rest) and evaluated on those, so the
numbers printed are validation accuracies. Points and seeds train side by side in worker processes.

With --out the grid resumes: the file is rewritten (then renamed) as each point and seed finishes, keeping every row of
other points, seeds and grids (a narrower grid on the same file adds to it), and a later call
with the same file reuses every score whose fingerprint (the point's resolved settings, the validation benchmark's
settings, the source file and the train code) is unchanged, so a grid of hours can stop and go on, on another machine
too; a stale score (other settings or code) is trained again. A seed still training keeps checkpoints beside the file
(<out>.progress/, at every task end and every params.yaml `checkpoint_minutes`, as a train stage's seed does), so a
stopped seed resumes where it was on the same machine, to the numbers it would have had; its checkpoint goes once its
score is written.
"""
from __future__ import annotations

import argparse
import contextlib
import itertools
import math
import multiprocessing
import statistics
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

import pandas as pd
import torch
import yaml
from tabulate import tabulate

from gcl.config import load_params, resolve_run, resolve_runtime
from gcl.core.fingerprint import fingerprint
from gcl.core.layout import source_file
from gcl.data.benchmarks import KINDS, TrainingSettings
from gcl.data.sources import load_source
from gcl.methods import METHODS
from gcl.methods.base import RunSettings
from gcl.training.checkpoint import Checkpoint
from gcl.training.compilation import compile_mode
from gcl.training.loop import DivergenceError
from gcl.training.train import run_seed

_BENCH: dict = {}   # the validation benchmark, built once in the parent and inherited by forked workers


def parse_grid(items: list[str]) -> dict[str, list]:
    """'lr=0.1,0.2' -> {'lr': [0.1, 0.2]}; values parse as YAML scalars (numbers, booleans, strings)."""
    grid = {}
    for item in items:
        key, sep, values = item.partition("=")
        if not sep or not key or not values:
            raise SystemExit(f"--grid item {item!r} must read key=value[,value...], e.g. lr=0.1,0.2")
        grid[key] = [yaml.safe_load(v) for v in values.split(",")]
    return grid


def _one(run: RunSettings, training: TrainingSettings, seed: int, threads: int, metric: str,
         checkpoint: Checkpoint | None = None) -> float:
    """One point and seed; a diverging point scores NaN (printed as diverged) instead of ending the grid."""
    torch.set_num_threads(threads)
    cpu = torch.device("cpu")
    try:
        return getattr(run_seed(_BENCH["bench"], training, run, seed, cpu, checkpoint=checkpoint,
                                compiled=compile_mode(training.compile, cpu, METHODS[run.algorithm])), metric)
    except DivergenceError:
        return float("nan")


def seed_checkpoint(out: str, point_print: str, seed: int, minutes: float) -> Checkpoint:
    """The checkpoint of one point's seed beside --out, named and fingerprinted by the point's fingerprint and the
    seed: a checkpoint of other settings, data or code is refused when the seed starts."""
    folder = Path(f"{out}.progress")
    folder.mkdir(parents=True, exist_ok=True)
    return Checkpoint(folder / f"{point_print}-seed-{seed}.ckpt", fingerprint(point_print, seed), 60.0 * minutes)


def write_scores(path: str, run: str, points: list[dict], seeds: list[int], scores: dict, metric: str,
                 prints: list[str] | None = None) -> None:
    """The grid's raw scores, long format (run, the point's settings, seed, score; NaN = diverged; with `prints`, each
    point's fingerprint), the points and seeds scored so far, merged into what `path` holds: a row of the file is
    replaced only by this call's score of the same fingerprint and seed, every other row (other points, seeds, grids
    or code) is kept, so that two grids sharing a file never erase each other. Written, then renamed."""
    records = pd.DataFrame([{"run": run, **point, "seed": seed, f"val_{metric}": scores[(i, seed)],
                             **({"fingerprint": prints[i]} if prints else {})}
                            for i, point in enumerate(points) for seed in seeds if (i, seed) in scores])
    if Path(path).exists() and prints:
        old = pd.read_csv(path)
        mine = set(zip(records["fingerprint"], records["seed"])) if len(records) else set()
        kept = old[[(f, s) not in mine for f, s in zip(old["fingerprint"], old["seed"])]]
        records = pd.concat([kept, records], ignore_index=True) if len(kept) else records
    tmp = Path(f"{path}.tmp")
    records.to_csv(tmp, index=False)
    tmp.replace(path)


def earlier_scores(path: str, run: str, points: list[dict], seeds: list[int], metric: str,
                   prints: list[str]) -> dict[tuple[int, int], float]:
    """The scores an earlier call wrote to `path` for these points and seeds, where the point's fingerprint is the
    same; {} without the file. A file of another run or metric is refused (one line: choose another --out)."""
    if not Path(path).exists():
        return {}
    old = pd.read_csv(path, dtype=str, keep_default_na=False)
    column = f"val_{metric}"
    if set(old.get("run", [])) - {run} or column not in old.columns or "fingerprint" not in old.columns:
        raise SystemExit(f"--out {path} holds other scores (another run, metric, or a file without fingerprints); "
                         "give this grid a file of its own")
    found = {}
    for i, point in enumerate(points):
        mine = old[old["fingerprint"] == prints[i]]
        for key, value in point.items():   # the same point: its values as this call writes them
            mine = mine[mine[key] == str(value)] if key in mine.columns else mine.iloc[0:0]
        for _, row in mine.iterrows():
            if int(row["seed"]) in seeds:
                found[(i, int(row["seed"]))] = float(row[column]) if row[column] else float("nan")
    return found


def main(argv: list[str] | None = None) -> list[dict]:
    """Score every point of the grid; prints the table and returns its rows, best first."""
    parser = argparse.ArgumentParser(prog="python -m gcl.tune", description=__doc__.splitlines()[0])
    parser.add_argument("run", help="a key under runs: in params.yaml, the starting point")
    parser.add_argument("--grid", nargs="+", default=[], help="key=v1,v2 ... (overrides of the run's settings)")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    parser.add_argument("--fraction", type=float, default=0.1, help="share of each class's training images held out")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--metric", choices=["class_il", "task_il"], default="class_il",
                        help="the validation accuracy that ranks the points (task_il needs a benchmark with tasks)")
    parser.add_argument("--out", help="also write every point and seed's score to this CSV (one row per point and seed)")
    args = parser.parse_args(argv)
    if not 0.0 < args.fraction < 1.0:
        raise SystemExit(f"--fraction must lie in (0, 1), got {args.fraction}")

    params = load_params(args.params)
    if args.run not in params["runs"]:
        raise SystemExit(f"{args.run!r} is not a run of {args.params}; its runs: {sorted(params['runs'])}")
    grid = parse_grid(args.grid)
    points = [dict(zip(grid, values)) for values in itertools.product(*grid.values())]
    configs = []
    for point in points:   # each point is validated as a run of params.yaml would be
        trial = {**params, "runs": {args.run: {**params["runs"][args.run], **point}}}
        configs.append(resolve_run(trial, args.run))
    training = configs[0].benchmark
    if any(c.benchmark != training for c in configs):
        raise SystemExit("--grid may not change the benchmark's settings (epochs); tune one value at a time")
    runtime = resolve_runtime(params)
    threads = runtime["threads"]
    data = configs[0].data.model_copy(update={"validation_fraction": args.fraction})
    source = load_source(source_file(data.source))
    _BENCH["bench"] = KINDS[data.kind].build(source, data)
    assert _BENCH["bench"]["evaluated_on"] == "validation"

    prints = [fingerprint(c.run.model_dump(mode="json"), training.model_dump(mode="json"), data.model_dump(mode="json"),
                          files=(source_file(data.source),)) for c in configs]
    scores = earlier_scores(args.out, args.run, points, args.seeds, args.metric, prints) if args.out else {}
    if scores:
        print(f"reused {len(scores)} score(s) from {args.out} (same settings and code)")
    jobs = [(i, seed) for i in range(len(configs)) for seed in args.seeds if (i, seed) not in scores]
    checkpoints = {(i, seed): seed_checkpoint(args.out, prints[i], seed, runtime["checkpoint_minutes"])
                   for i, seed in jobs} if args.out else {}
    with ProcessPoolExecutor(max(1, min(args.workers, len(jobs))), mp_context=multiprocessing.get_context("fork")) as pool:
        futures = {pool.submit(_one, configs[job[0]].run, training, job[1], threads, args.metric,
                               checkpoints.get(job)): job for job in jobs}
        for done in as_completed(futures):
            scores[futures[done]] = done.result()
            if args.out:   # each score kept as it comes: a stopped grid resumes from here
                write_scores(args.out, args.run, points, args.seeds, scores, args.metric, prints)
                checkpoints[futures[done]].discard()
    if args.out:
        with contextlib.suppress(OSError):     # the checkpoints' folder goes once the last has gone
            Path(f"{args.out}.progress").rmdir()
    rows = []
    name = {"class_il": "Class-IL", "task_il": "Task-IL"}[args.metric]
    label = f"val {name} mean"
    for i, point in enumerate(points):
        accs = [scores[(i, s)] for s in args.seeds]
        diverged = any(math.isnan(a) for a in accs)
        rows.append({**point, label: float("-inf") if diverged else statistics.fmean(accs),
                     "std": 0.0 if diverged or len(accs) < 2 else statistics.stdev(accs),
                     "per seed": " ".join("diverged" if math.isnan(a) else f"{a:.2f}" for a in accs)})
    rows.sort(key=lambda r: -r[label])
    for r in rows:
        if r[label] == float("-inf"):
            r[label], r["std"] = "diverged", "-"
    print(f"{args.run}: validation {name} % ({args.fraction:.0%} of each class held out), seeds {args.seeds}")
    shown = [{k: str(v) if k in grid else v for k, v in r.items()} for r in rows]   # grid values as given (0.999, not 1.00)
    print(tabulate(shown, headers="keys", floatfmt=".2f"))
    return rows


if __name__ == "__main__":
    main()
