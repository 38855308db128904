"""`python -m gcl.bench compile`: how much faster a compiled backbone trains than the eager one on this device, side
by side, per method.

    python -m gcl.bench compile                                 # profiles/paper.yaml's seq-cifar10 ER, DER++, CoCa
    python -m gcl.bench compile --benchmarks seq-cifar100 --methods coca --steps 400 --bf16

For each (benchmark, method) pair (the run with its largest buffer), seed 0 trains the first `--steps` steps of
its real stream twice through the training loop, once eager and once compiled (the benchmarks' `compile`
setting; on a GPU CUDA graphs), from the same initial network and the same random numbers, on random images of
the real shape (gcl.bench.common), with the device's usual kernels, as training runs them. Printed per pair:

- ms/step of each, over the steps after the first `--warmup` (the loop's first 20 steps are eager in both; then
  come the compilation and the recording of the CUDA graphs, whose cost is printed apart, as seconds);
- their ratio: the speed-up.

Methods that are not compiled (eager only, or trained after the stream) are skipped, saying so.

Whether the compiled step computes what the eager one does is a test, not a timing: tests/test_compile.py trains the
same two passes with `train` below and compares their losses (on a GPU with deterministic kernels).
"""
from __future__ import annotations

import argparse
import dataclasses
import time

import torch
from tabulate import tabulate

from gcl.bench.common import Quiet, cells_of, random_benchmark, split, sync
from gcl.config import load_params, resolve_run
from gcl.data.random_sources import random_source, shape_of
from gcl.methods import METHODS
from gcl.training.compilation import compile_mode
from gcl.training.loop import EAGER_STEPS
from gcl.training.progress import StreamProgress
from gcl.training.spec import ResolvedRun
from gcl.training.train import setup_seed


def first_steps(stream, steps: int):
    """The stream cut to its first `steps` steps, evaluated once at the end, without task boundaries."""
    steps = min(steps, stream.steps)
    return dataclasses.replace(stream, bounds=stream.bounds[:steps + 1], eval_after=[steps - 1], task_ends=[],
                               task_classes=None)


def train(spec: ResolvedRun, bench: dict, device: torch.device, compiled: bool, steps: int, warmup: int) -> dict:
    """Losses of every step and the wall time of the steps after `warmup` (and of the first `warmup`): seed 0 of run
    `spec`, the first `steps` steps of its stream, eager or compiled."""
    mode = compile_mode(compiled, device, METHODS[spec.run.algorithm])
    s = setup_seed(bench, spec.benchmark, spec.run, 0, device, mode)
    loop = s.loop
    loop.stream = first_steps(s.stream, steps)
    losses, marks = [], []
    observe = s.method.observe

    def observed(*args):
        if len(losses) in (0, warmup):
            sync(device)
            marks.append(time.perf_counter())
        loss = observe(*args)
        losses.append(loss)
        if len(losses) == loop.stream.steps:   # the last step: the evaluation that follows is not timed
            sync(device)
            marks.append(time.perf_counter())
        return loss

    s.method.observe = observed
    loop.run(StreamProgress(Quiet(spec.key), loop.stream, False, 1, 0))
    start, timed_from, end = marks
    return {"losses": torch.stack(losses).float().cpu(), "warmup_s": timed_from - start,
            "ms_step": 1e3 * (end - timed_from) / (len(losses) - warmup), "compiled": s.net.compile_mode}


def compare(eager: dict, compiled: dict) -> dict:
    return {"eager_ms": eager["ms_step"], "compiled_ms": compiled["ms_step"],
            "speedup": eager["ms_step"] / compiled["ms_step"], "compile_s": compiled["warmup_s"] - eager["warmup_s"],
            "mode": compiled["compiled"]}


def main(argv=None) -> list[dict]:
    p = argparse.ArgumentParser(prog="python -m gcl.bench compile", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--profile", default="profiles/paper.yaml")
    p.add_argument("--benchmarks", default="seq-cifar10", help="comma-separated benchmarks of the profile")
    p.add_argument("--methods", default="er,derpp,coca", help="comma-separated methods (keys of methods:)")
    p.add_argument("--steps", type=int, default=300, help="stream steps trained each way")
    p.add_argument("--warmup", type=int, default=40, help="first steps left out of the step time (the loop's "
                   "first 20 are eager in both, then the compiled backbone compiles)")
    p.add_argument("--device", default="auto", help="auto (cuda if present), cpu, cuda or cuda:N")
    p.add_argument("--bf16", action="store_true", help="bf16 autocast in both (the benchmarks' bf16 setting)")
    args = p.parse_args(argv)
    if not EAGER_STEPS + 5 <= args.warmup < args.steps:   # compiling, then recording CUDA graphs, takes 2-3 steps
        p.error(f"--warmup must be at least {EAGER_STEPS + 5} (the loop's {EAGER_STEPS} eager first steps, then the "
                "compilation) and smaller than --steps")
    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device)
    params = load_params(args.profile)
    pairs = cells_of(params, split(args.benchmarks), split(args.methods))
    if not pairs:
        p.error("no run of the profile matches --benchmarks / --methods")
    rows, benches = [], {}
    for (bench_name, method), keys in pairs.items():
        spec = resolve_run(params, keys[0])
        spec = spec.model_copy(update={"benchmark": spec.benchmark.model_copy(update={"bf16": args.bf16})})
        method_cls = METHODS[spec.run.algorithm]
        if not method_cls.capturable or method_cls.offline:
            print(f"{bench_name} {method}: not compiled (eager only, or trains after the stream); skipped")
            continue
        if bench_name not in benches:
            benches[bench_name] = random_benchmark(spec.data, random_source(shape_of(params, spec.data.source)))
        eager = train(spec, benches[bench_name], device, False, args.steps, args.warmup)
        compiled = train(spec, benches[bench_name], device, True, args.steps, args.warmup)
        rows.append({"benchmark": bench_name, "method": method, **compare(eager, compiled)})
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"{args.profile} on {name}, torch {torch.__version__}, {'bf16' if args.bf16 else 'fp32'}; {args.steps} steps "
          f"each way, step times after {args.warmup}")
    table = [{"benchmark": r["benchmark"], "method": r["method"], "mode": r["mode"], "eager ms": r["eager_ms"],
              "compiled ms": r["compiled_ms"], "x": r["speedup"], "compile s": r["compile_s"]} for r in rows]
    print(tabulate(table, headers="keys", floatfmt=".4g"))
    return rows
