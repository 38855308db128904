"""Does a compiled backbone train as the eager one on this machine, and how much faster? Side by side, per method.

    python tools/compilecheck.py                                   # profiles/paper.yaml's seq-cifar10 ER, DER++, CoCa
    python tools/compilecheck.py --benchmarks seq-cifar100 --methods coca --steps 400 --bf16

For each (benchmark, method) pair (the run with its largest buffer), seed 0 trains the first `--steps` steps of
its real stream twice through the training loop, once eager and once compiled (the benchmarks' `compile`
setting; on a GPU CUDA graphs), from the same initial network and the same random numbers, on random images of
the real shape (tools/synthetic.py). Printed per pair:

- ms/step of each, over the steps after the first `--warmup` (the loop's first 20 steps are eager in both; then
  come the compilation and the recording of the CUDA graphs, whose cost is printed apart, as seconds);
- the loss of the first compiled step in each: the same network and inputs through the same arithmetic (the
  eager steps before it are identical), so they may differ by rounding only;
- the largest relative loss difference over the 10 steps from there, and the mean loss over the last 50 steps
  of each: rounding differences grow as training goes on, but the two must keep training alike.

A pair whose first compiled losses differ by more than `--tolerance` (relative) is flagged; the exit status is 1.

`--kernels`: on a GPU the eager steps before the first compiled one are identical only with deterministic kernels
(the default here, `deterministic`: torch.use_deterministic_algorithms, no TF32). With CUDA's usual fast kernels
the two passes drift apart during the first eager steps already (measured on an H100, fp32: ER's first compiled
losses 0.0013 and 0.000004, DER++'s 5% apart; with deterministic kernels 1e-6 and 2e-7 apart), so `fast` times
the steps as training runs them and prints the losses without checking them. Step times under `deterministic`
are slower than training's.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from pathlib import Path

import torch
from tabulate import tabulate

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gcl.config import load_params, resolve_run  # noqa: E402
from gcl.methods import METHODS  # noqa: E402
from gcl.training.compilation import compile_mode  # noqa: E402
from gcl.training.loop import EAGER_STEPS  # noqa: E402
from gcl.training.progress import StreamProgress  # noqa: E402
from gcl.training.spec import ResolvedRun  # noqa: E402
from gcl.training.train import setup_seed  # noqa: E402
from gridcost import Quiet, cells_of  # noqa: E402
from synthetic import random_benchmark, random_source, shape_of  # noqa: E402


def use_deterministic_kernels() -> None:
    """Deterministic kernels and no TF32, so that two passes from the same network and inputs stay identical
    through their eager steps (cuBLAS needs its workspace setting before its first use)."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True, warn_only=True)   # warn where a kernel has no deterministic version
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False


def first_steps(stream, steps: int):
    """The stream cut to its first `steps` steps, evaluated once at the end, without task boundaries."""
    steps = min(steps, stream.steps)
    return dataclasses.replace(stream, bounds=stream.bounds[:steps + 1], eval_after=[steps - 1], task_ends=[],
                               task_classes=None)


def train(spec: ResolvedRun, bench: dict, device: torch.device, compiled: bool, steps: int, warmup: int) -> dict:
    """Losses of every step and the wall time of the steps after `warmup` (and of the first `warmup`)."""
    mode = compile_mode(compiled, device, METHODS[spec.run.algorithm])
    s = setup_seed(bench, spec.benchmark, spec.run, 0, device, mode)
    loop = s.loop
    loop.stream = first_steps(s.stream, steps)
    losses, marks = [], []
    observe = s.method.observe

    def observed(*args):
        if len(losses) in (0, warmup):
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            marks.append(time.perf_counter())
        loss = observe(*args)
        losses.append(loss)
        if len(losses) == loop.stream.steps:   # the last step: the evaluation that follows is not timed
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            marks.append(time.perf_counter())
        return loss

    s.method.observe = observed
    loop.run(StreamProgress(Quiet(spec.key), loop.stream, False, 1, 0))
    start, timed_from, end = marks
    return {"losses": torch.stack(losses).float().cpu(), "warmup_s": timed_from - start,
            "ms_step": 1e3 * (end - timed_from) / (len(losses) - warmup), "compiled": s.net.compile_mode}


def compare(eager: dict, compiled: dict) -> dict:
    a, b = eager["losses"][EAGER_STEPS:], compiled["losses"][EAGER_STEPS:]   # the steps a compiled backbone runs
    rel = ((a - b).abs() / a.abs().clamp(min=1e-12))
    tail = min(50, len(a))
    return {"eager_ms": eager["ms_step"], "compiled_ms": compiled["ms_step"],
            "speedup": eager["ms_step"] / compiled["ms_step"], "compile_s": compiled["warmup_s"] - eager["warmup_s"],
            "first_eager": float(a[0]), "first_compiled": float(b[0]), "first_rel": float(rel[0]),
            "rel_10": float(rel[:10].max()), "tail_eager": float(a[-tail:].mean()),
            "tail_compiled": float(b[-tail:].mean()), "mode": compiled["compiled"]}


def main(argv=None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--profile", default="profiles/paper.yaml")
    p.add_argument("--benchmarks", default="seq-cifar10", help="comma-separated benchmarks of the profile")
    p.add_argument("--methods", default="er,derpp,coca", help="comma-separated methods (keys of methods:)")
    p.add_argument("--steps", type=int, default=300, help="stream steps trained each way")
    p.add_argument("--warmup", type=int, default=40, help="first steps left out of the step time (the loop's "
                   "first 20 are eager in both, then the compiled backbone compiles)")
    p.add_argument("--device", default="auto", help="auto (cuda if present), cpu, cuda or cuda:N")
    p.add_argument("--bf16", action="store_true", help="bf16 autocast in both (the benchmarks' bf16 setting)")
    p.add_argument("--tolerance", type=float, default=1e-3, help="largest relative difference of the first loss")
    p.add_argument("--kernels", choices=["deterministic", "fast"], default="deterministic",
                   help="deterministic (default): the loss check holds on a GPU; fast: CUDA's usual kernels, the step "
                   "times training sees, losses not checked (see above)")
    args = p.parse_args(argv)
    if not EAGER_STEPS + 5 <= args.warmup < args.steps:   # compiling, then recording CUDA graphs, takes 2-3 steps
        p.error(f"--warmup must be at least {EAGER_STEPS + 5} (the loop's {EAGER_STEPS} eager first steps, then the "
                "compilation) and smaller than --steps")
    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device)
    checked = args.kernels == "deterministic" or device.type != "cuda"   # a CPU's kernels are deterministic
    if args.kernels == "deterministic" and device.type == "cuda":
        use_deterministic_kernels()
    params = load_params(args.profile)
    split = lambda s: [x for x in s.split(",") if x]
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
    print(f"{args.profile} on {name}, torch {torch.__version__}, {'bf16' if args.bf16 else 'fp32'}, {args.kernels} "
          f"kernels; {args.steps} steps each way, step times after {args.warmup}")
    bad = [r for r in rows if r["first_rel"] > args.tolerance] if checked else []
    table = [{"benchmark": r["benchmark"], "method": r["method"], "mode": r["mode"], "eager ms": r["eager_ms"],
              "compiled ms": r["compiled_ms"], "x": r["speedup"], "compile s": r["compile_s"],
              "loss eager": r["first_eager"], "loss compiled": r["first_compiled"], "rel. diff": r["first_rel"],
              "max rel. diff, 10 steps": r["rel_10"], "last 50 eager": r["tail_eager"],
              "last 50 compiled": r["tail_compiled"], "": "!" if r in bad else ""} for r in rows]
    print(tabulate(table, headers="keys", floatfmt=".4g"))
    if bad:
        print(f"the first loss differs beyond {args.tolerance} for: " + ", ".join(f"{r['benchmark']}/{r['method']}"
                                                                          for r in bad))
        raise SystemExit(1)
    if not checked:
        print("losses not checked: CUDA's fast kernels are not deterministic (--kernels deterministic checks them)")
    return rows


if __name__ == "__main__":
    main()
