"""`python -m gcl.bench grid`: what a whole profile costs to train on this machine, projected from timed steps on
random images of the real shapes.

    python -m gcl.bench grid                                    # profiles/paper.yaml, on the GPU if there is one
    python -m gcl.bench grid --benchmarks seq-cifar10 --methods er,derpp,coca --steps 200
    python -m gcl.bench grid --processes 8                      # 8 runs sharing the device at once

One run of every (benchmark, method) pair of the profile is timed (its largest buffer, where memory-heavy
methods cost most) through the training loop itself (gcl.training.loop.StreamLoop, as `dvc repro` trains):
`--warmup` steps of the first task, the task boundary (for methods that are told it), then `--steps` timed
steps of the second task, on a benchmark of the real size built from random uint8 images (the source's real
classes, images per class and shape; gcl.bench.common). One evaluation pass over the whole test set
is timed too. A seed of a run is projected as

    stream steps x step time + tasks x boundary time + (evaluations + 1) x evaluation time

with the stream steps and evaluations of the real stream (every epoch; the + 1 is the final confusion
matrix), and a run as its seeds times that; the profile is the sum over its runs. Every run of a pair takes
the pair's step, boundary and evaluation times. JOINT trains once the stream is over: it is timed as SGD
steps at its settings, `epochs` passes over the whole training set.

With `--processes K`, K processes time every cell at the same moment (a barrier before each), as K runs (or
a run's K seeds, `workers: K`) sharing the device would; a cell's effective step time is the mean step
time of the K processes divided by K, and the projection uses the effective times.

What the projection leaves out: CN-DPM's sleep phases unless the timed window holds one (its row is marked
'>='), and per-seed start-up (data loading, building the network).
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import multiprocessing
from queue import Empty

import torch

from gcl.bench.common import Clock, Quiet, cells_of, random_benchmark, split
from gcl.config import load_params, resolve_run
from gcl.core.devices import compile_threads, share_compile_threads
from gcl.data.benchmarks import KINDS
from gcl.data.random_sources import random_source, shape_of
from gcl.methods import METHODS
from gcl.training.compilation import compile_mode
from gcl.training.progress import StreamProgress
from gcl.training.spec import ResolvedRun
from gcl.training.train import setup_seed


def timing_stream(stream, has_tasks: bool, warmup: int, steps: int):
    """The real stream cut to `warmup` steps of its first task (or segment) and `steps` steps right after the
    first task's end (the stream's next steps on a benchmark without tasks), evaluated after each part."""
    first_end = stream.task_ends[0] if has_tasks else warmup - 1
    warmup = min(warmup, first_end + 1)
    steps = min(steps, stream.steps - first_end - 1)
    if steps <= 0:
        raise ValueError("the stream's first task is all of it: nothing after it to time")
    parts = [(0, warmup), (first_end + 1, first_end + 1 + steps)]
    b = stream.bounds
    order = torch.cat([stream.order[b[lo]:b[hi]] for lo, hi in parts])
    sizes = [b[s + 1] - b[s] for lo, hi in parts for s in range(lo, hi)]
    bounds = [0]
    for n in sizes:
        bounds.append(bounds[-1] + n)
    marks = [warmup - 1, warmup + steps - 1]
    return dataclasses.replace(stream, order=order, bounds=bounds, eval_after=marks,
                               task_ends=marks if has_tasks else [],
                               task_classes=stream.task_classes[:2] if stream.task_classes else None), steps


def traced(run, device: torch.device):
    """Run `run()` under PyTorch's profiler, with CUDA's warnings on every host synchronisation, and print where
    the host time went."""
    import warnings

    from torch.profiler import ProfilerActivity, profile
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    if device.type == "cuda":
        torch.cuda.set_sync_debug_mode("warn")
    with warnings.catch_warnings(record=True) as caught, profile(activities=activities) as prof:
        warnings.simplefilter("always")
        run()
    torch.cuda.set_sync_debug_mode(0) if device.type == "cuda" else None
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30))
    where = {}
    for w in caught:
        where[(w.filename, w.lineno)] = where.get((w.filename, w.lineno), 0) + 1
    for (f, line), n in sorted(where.items(), key=lambda kv: -kv[1])[:20]:
        print(f"synchronisations: {n:>6} at {f}:{line}")


def time_cell(spec: ResolvedRun, bench: dict, device: torch.device, warmup: int, steps: int, barrier=None,
              trace: bool = False) -> dict:
    """One run's step, boundary and evaluation times, and the size of its real stream."""
    run, training = spec.run, spec.benchmark
    method_cls, kind = METHODS[run.algorithm], KINDS[training.kind]
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    if method_cls.offline:   # JOINT: its cost is plain training steps once the stream is over
        sgd = METHODS["sgd"].Run
        run = sgd.model_validate(run.model_dump(include=set(sgd.model_fields) - {"algorithm"}))
    s = setup_seed(bench, training, run, 0, device, compile_mode(training.compile, device, METHODS[run.algorithm]))
    real, loop, clock = s.stream, s.loop, Clock(device)
    if method_cls.offline:   # one pass to keep the stream, then `epochs` passes over what it kept, one evaluation
        kept = kind.stream(bench, training, 1, run.batch, torch.Generator()).n_samples
        real_steps, real_evals = math.ceil(kept / run.batch) * training.epochs, 1
    else:
        real_steps, real_evals = real.steps, len(real.eval_after)
    has_tasks = kind.has_tasks
    loop.stream, timed = timing_stream(real, has_tasks, warmup, steps)

    marks, boundaries = [], []   # (start, end) of every evaluation and every boundary call

    def spans(fn, into):
        def wrapped(*args, **kwargs):
            start = clock()
            out = fn(*args, **kwargs)
            into.append((start, clock()))
            return out
        return wrapped

    loop.evaluate_now = spans(loop.evaluate_now, marks)
    if loop.tell_boundaries:
        s.method.end_task = spans(s.method.end_task, boundaries)
        s.method.begin_task = spans(s.method.begin_task, boundaries)
    sleeps = []
    if hasattr(s.method, "sleep"):   # CN-DPM: did the window hold a sleep phase?
        s.method.sleep = spans(s.method.sleep, sleeps)
    if barrier is not None:
        barrier.wait()
    run_loop = lambda: loop.run(StreamProgress(Quiet(spec.key), loop.stream, has_tasks, 1, 0))
    traced(run_loop, device) if trace else run_loop()
    (_, first_eval_end), (second_eval_start, _) = marks[0], marks[1]
    inside = [e - b for b, e in boundaries if b >= first_eval_end and e <= second_eval_start]
    step = (second_eval_start - first_eval_end - sum(inside)) / timed
    # the first task's boundary (end_task + begin_task), as every later boundary costs
    boundary = sum(e - b for b, e in boundaries if e <= first_eval_end)
    start = clock()
    s.net.eval()
    with s.amp():
        s.evaluate(s.method.predict)
    evaluation = clock() - start
    peak = torch.cuda.max_memory_reserved(device) / 2**30 if device.type == "cuda" else None
    return {"step": step, "boundary": boundary, "evaluation": evaluation, "timed_steps": timed, "gib": peak,
            "real_steps": real_steps, "real_evals": real_evals, "n_tasks": len(real.task_ends) if has_tasks else 0,
            "partial": hasattr(s.method, "sleep") and not sleeps}


def time_cells(profile: str, pairs: dict, shapes: dict, device: str, warmup: int, steps: int, overrides: dict,
               barrier=None, queue=None, trace: bool = False) -> dict:
    """Every pair's timings in this process (one of several when `barrier` is given); `shapes`: each source's;
    `overrides`: benchmark training settings set for every cell (bf16, channels_last, compile)."""
    params = load_params(profile)
    device = torch.device(device)
    if device.index is not None:
        torch.cuda.set_device(device)
    benches, out = {}, {}
    for pair, keys in pairs.items():
        spec = resolve_run(params, keys[0])
        spec = spec.model_copy(update={"benchmark": spec.benchmark.model_copy(update=overrides)})
        name = spec.run.benchmark
        if name not in benches:
            benches[name] = random_benchmark(spec.data, random_source(shapes[spec.data.source]))
        out[pair] = time_cell(spec, benches[name], device, warmup, steps, barrier, trace)
    if queue is not None:
        queue.put(out)
    return out


def measure(profile: str, pairs: dict, device: str, warmup: int, steps: int, processes: int, overrides: dict,
            trace: bool = False) -> dict:
    """Per pair: the timings, with `effective` (seconds per step of the device's throughput) added."""
    params = load_params(profile)
    sources = {params["benchmarks"][bench]["source"] for bench, _ in pairs}
    shapes = {name: shape_of(params, name) for name in sources}
    if processes == 1:
        results = [time_cells(profile, pairs, shapes, device, warmup, steps, overrides, trace=trace)]
    else:
        ctx = multiprocessing.get_context("spawn")
        share_compile_threads(compile_threads(processes))   # inherited by the processes, as a run's seed workers do
        barrier, queue = ctx.Barrier(processes), ctx.Queue()
        procs = [ctx.Process(target=time_cells, args=(profile, pairs, shapes, device, warmup, steps, overrides,
                                                      barrier, queue)) for _ in range(processes)]
        for p in procs:
            p.start()
        results = []
        while len(results) < processes:
            try:
                results.append(queue.get(timeout=5.0))
            except Empty:
                failed = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
                if failed:   # the others would wait at the barrier for ever
                    for p in procs:
                        p.terminate()
                    raise SystemExit(f"a timing process failed (exit {failed[0]}); its traceback is above")
        for p in procs:
            p.join()
    merged = {}
    for pair in pairs:
        rows = [r[pair] for r in results]
        mean = lambda k: sum(r[k] for r in rows) / len(rows)
        merged[pair] = {**rows[0], "gib": max((r["gib"] for r in rows), default=None) if rows[0]["gib"] is not None
                        else None, "step": mean("step"), "boundary": mean("boundary"), "evaluation": mean("evaluation"),
                        "effective": mean("step") / processes, "effective_boundary": mean("boundary") / processes,
                        "effective_evaluation": mean("evaluation") / processes,
                        "partial": any(r["partial"] for r in rows)}
    return merged


def project(params: dict, pairs: dict, timings: dict) -> list[dict]:
    """Device-hours of every pair's runs (all their seeds), from the effective times."""
    rows = []
    for pair, keys in pairs.items():
        t = timings[pair]
        seeds = sum(len(resolve_run(params, k).seeds) for k in keys)
        per_seed = (t["real_steps"] * t["effective"] + t["n_tasks"] * t["effective_boundary"]
                    + (t["real_evals"] + 1) * t["effective_evaluation"])
        rows.append({"benchmark": pair[0], "method": pair[1], "runs": len(keys), "seeds": seeds, **t,
                     "hours": seeds * per_seed / 3600.0})
    return rows


def print_table(rows: list[dict], device: str, processes: int, args) -> None:
    name = torch.cuda.get_device_name(torch.device(device)) if device.startswith("cuda") else "CPU"
    print(f"{args.profile} on {name} ({device}), torch {torch.__version__}, {processes} process(es) sharing it, "
          f"{'bf16' if args.bf16 else 'fp32'}{', channels_last' if args.channels_last else ''}, compile "
          f"{args.compile}; "
          f"{args.steps} timed steps after {args.warmup} of warm-up per cell")
    head = (f"{'benchmark':<18}{'method':<14}{'runs':>5}{'seeds':>6}{'ms/step':>9}{'eff. ms':>9}{'boundary s':>11}"
            f"{'eval s':>8}{'GiB':>6}{'steps/seed':>11}{'hours':>9}")
    print(head)
    print("-" * len(head))
    total, by_bench = 0.0, {}
    for r in sorted(rows, key=lambda r: (r["benchmark"], -r["hours"])):
        mark = ">=" if r["partial"] else ""
        print(f"{r['benchmark']:<18}{r['method']:<14}{r['runs']:>5}{r['seeds']:>6}{1e3 * r['step']:>9.2f}"
              f"{1e3 * r['effective']:>9.2f}{r['boundary']:>11.2f}{r['evaluation']:>8.2f}"
              f"{'-' if r['gib'] is None else format(r['gib'], '.1f'):>6}{r['real_steps']:>11}"
              f"{mark:>3}{r['hours']:>6.2f}")
        total += r["hours"]
        by_bench[r["benchmark"]] = by_bench.get(r["benchmark"], 0.0) + r["hours"]
    print("-" * len(head))
    for bench, hours in sorted(by_bench.items(), key=lambda kv: -kv[1]):
        print(f"{bench:<18}{hours:>10.2f} device-hours")
    partial = " (>=: CN-DPM without a sleep phase in its window)" if any(r["partial"] for r in rows) else ""
    print(f"{'whole profile':<18}{total:>10.2f} device-hours{partial}")


def main(argv=None) -> list[dict]:
    p = argparse.ArgumentParser(prog="python -m gcl.bench grid", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--profile", default="profiles/paper.yaml", help="the params file whose runs are projected")
    p.add_argument("--benchmarks", default="", help="comma-separated benchmarks of the profile (default: all)")
    p.add_argument("--methods", default="", help="comma-separated methods (keys of methods:) (default: all)")
    p.add_argument("--steps", type=int, default=100, help="timed steps per cell")
    p.add_argument("--warmup", type=int, default=40, help="steps of the first task before the boundary (compiled "
                   "backbones: the loop's first 20 steps are eager, then each shape compiles)")
    p.add_argument("--processes", type=int, default=1, help="processes timing every cell at once on the device")
    p.add_argument("--device", default="auto", help="auto (cuda if present), cpu, cuda or cuda:N")
    p.add_argument("--bf16", action="store_true", help="bf16 autocast (the benchmarks' bf16 setting)")
    p.add_argument("--channels-last", action="store_true", help="NHWC layout (the benchmarks' channels_last setting)")
    p.add_argument("--compile", choices=("auto", "on", "off"), default="auto",
                   help="compiled backbones (the benchmarks' compile setting; auto: on a GPU, for the methods that allow it)")
    p.add_argument("--threads", type=int, default=None, help="CPU intra-op threads per process (default: torch's)")
    p.add_argument("--trace", action="store_true", help="print where the host time of each cell goes (PyTorch's "
                   "profiler) and every host synchronisation (CUDA); one process only")
    args = p.parse_args(argv)
    if args.trace and args.processes > 1:
        p.error("--trace profiles one process: drop --processes")
    if args.threads:
        torch.set_num_threads(args.threads)
    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    params = load_params(args.profile)
    pairs = cells_of(params, split(args.benchmarks), split(args.methods))
    if not pairs:
        p.error("no run of the profile matches --benchmarks / --methods")
    overrides = {"bf16": args.bf16, "channels_last": args.channels_last,
                 "compile": {"auto": "auto", "on": True, "off": False}[args.compile]}
    timings = measure(args.profile, pairs, device, args.warmup, args.steps, args.processes, overrides, args.trace)
    rows = project(params, pairs, timings)
    print_table(rows, device, args.processes, args)
    return rows

