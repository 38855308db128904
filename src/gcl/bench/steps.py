"""`python -m gcl.bench steps`: what each method costs per training step, beside a bare forward/backward/SGD loop
of the same shapes.

    python -m gcl.bench steps                        # MLP: seq-MNIST shapes, params.yaml's seq-mnist settings
    python -m gcl.bench steps --backbone resnet18    # ResNet-18: seq-CIFAR-10 shapes, profiles/paper.yaml's settings
    python -m gcl.bench steps --methods er,derpp --device cuda --bf16 --channels-last
    python -m gcl.bench steps --cell seq-mnist-er-200  # one seed of one run of params.yaml, as dvc repro trains it
    python -m gcl.bench steps --stacked 10           # every stackable method: 10 seeds stacked vs the same seeds alone
    python -m gcl.bench steps --stacked 5 --backbone resnet18   # the same on seq-CIFAR-10's ResNet-18
    python -m gcl.bench steps --online               # the online profile's ER step as trained vs the bare loop
    python -m gcl.bench steps --methods er,er-star --set star_samples=all   # a plug-in at its base method's run

A method step is what the training loop does per stream batch: the batched augmentation of the stream
batch, then `observe` (replay, distillation, buffer insertion, the update). Each method runs with the
settings of its run in a profile (the benchmark and buffer below, else another buffer, else another
benchmark with the same backbone); boundary-aware methods are timed inside their second task, after
`end_task` of the first, so that their distillation, exemplars or penalties are active. Task-boundary
work itself (iCaRL's herding, oEWC's Fisher, ...) is not in the step time. The bare loop is plain
PyTorch: the same backbone, forward, cross-entropy, backward and an SGD update (one multi-tensor op) on
an already-augmented batch of the stream batch's size. Data are random uint8 images of the real shape (only the time matters). The
loops take turns in `--rounds` rounds of `--steps` steps each; a loop's time per step is its total over
all rounds divided by its steps (so that a method's occasional heavy step, such as CN-DPM's sleep
phase, counts at its real rate when the window holds one). `--cell` and `--stacked` time whole seeds instead
(gcl.bench.whole_seeds). Profiles and params.yaml are read from the current folder (the project's root) unless --profile
names one.

A plug-in method without a run of its own in the profile (STAR's er-star, derpp-star) is timed at its base
method's run (the registered method it extends), its own settings at their defaults; `--set KEY=VALUE` (YAML values,
repeatable) overrides a setting of every timed method that declares it (e.g. `--set star_samples=all`: STAR's term
in every step, as once the network classifies its buffer correctly; on random images it rarely does).
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import sys
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from gcl.bench.common import random_benchmark, run_as, split, sync
from gcl.bench.whole_seeds import stacked_table, time_cell
from gcl.config import load_params, resolve_run
from gcl.core.backbones import build_backbone
from gcl.data.benchmarks import KINDS
from gcl.data.random_sources import SOURCE_SHAPES, random_source
from gcl.methods import METHODS, MethodContext
from gcl.methods.base import TaskData


@dataclass(frozen=True)
class Preset:
    profile: str
    benchmark: str
    buffer: int
    source: str             # a key of SOURCE_SHAPES: the images' shape and normalisation
    steps: dict             # timed steps per round by device type


PRESETS = {
    "mlp": Preset("params.yaml", "seq-mnist", 200, "mnist-bundled", {"cpu": 100, "cuda": 200}),
    "resnet18": Preset("profiles/paper.yaml", "seq-cifar10", 500, "cifar10",
                       {"cpu": 2, "cuda": 50}),
    # --online: the width-20 ResNet-18 of the single-pass profile, each method at its run's own settings
    "online": Preset("profiles/online-cifar10.yaml", "online-cifar10", 200, "cifar10", {"cpu": 10, "cuda": 50}),
}
CLASSES, PER_CLASS = 10, 64


def autocast(device: torch.device, bf16: bool):
    return torch.autocast(device.type, dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()


def run_of(params: dict, preset: Preset, method: str) -> str | None:
    """The profile's run for `method`: on the preset's benchmark at its buffer, else at any buffer, else on another
    benchmark with the same backbone."""
    backbone = params["benchmarks"][preset.benchmark]["backbone"]
    runs = [(k, r) for k, r in params["runs"].items() if r["method"] == method
            and params["benchmarks"][r["benchmark"]]["backbone"] == backbone]
    for wanted in (lambda r: r["benchmark"] == preset.benchmark and r["buffer"] in (preset.buffer, "none"),
                   lambda r: r["benchmark"] == preset.benchmark, lambda r: True):
        found = [k for k, r in runs if wanted(r)]
        if found:
            return found[0]
    return None


def base_method(name: str) -> str | None:
    """The registered method that method `name` plugs into (er-star's er), or None: the nearest registered class it
    extends, if every setting it adds has a default (so derpp, whose beta has none, is no plug-in of der)."""
    cls = METHODS[name]
    base = next((c for c in cls.__mro__[1:] if METHODS.get(getattr(c, "name", None)) is c), None)
    if base is None:
        return None
    added = set(cls.Run.model_fields) - set(base.Run.model_fields)
    return base.name if not any(cls.Run.model_fields[f].is_required() for f in added) else None


def timed_run(params: dict, preset: Preset, name: str) -> tuple[str | None, str | None]:
    """(the profile's run whose settings `name` is timed at, the base method it is borrowed from or None)."""
    key = run_of(params, preset, name)
    if key is not None or (base := base_method(name)) is None:
        return key, None
    key = run_of(params, preset, base)
    return key, base if key else None


def synthetic_benchmark(spec, preset: Preset) -> dict:
    """The run's benchmark built from random images of the preset's shape (every setting of the run's own)."""
    return random_benchmark(spec.data, random_source(SOURCE_SHAPES[preset.source], PER_CLASS, 4))


class Batches:
    """Random stream batches of one task (a benchmark without tasks, MNIST-360: of its whole stream), on the device."""

    def __init__(self, bench: dict, task: int, batch: int, device: torch.device):
        tasks = bench.get("train_task")
        idx = torch.arange(len(bench["train_y"])) if tasks is None else torch.nonzero(tasks == task).flatten()
        self.x, self.y = bench["train_x"][idx].to(device), bench["train_y"][idx].to(device)
        self.batch, self.g = batch, torch.Generator().manual_seed(task)
        c = bench.get("classes_per_task") or CLASSES
        self.task = TaskData(index=task, x_raw=self.x, y=self.y, classes=(task * c, (task + 1) * c))

    def __call__(self) -> tuple[torch.Tensor, torch.Tensor]:
        i = torch.randint(0, len(self.y), (self.batch,), generator=self.g).to(self.x.device)
        return self.x[i], self.y[i]


def method_loop(key: str, params: dict, preset: Preset, args, device: torch.device, algorithm: str | None = None):
    """One method at its run's settings: task 0 to fill its memory (and end it), then steps of task 1. `algorithm`:
    time that method at this run's settings (a plug-in at its base's run); --set overrides what it declares."""
    spec = resolve_run(params, key)
    run = spec.run
    run = run_as(run, METHODS[algorithm or run.algorithm], args.set, algorithm)
    training = spec.benchmark
    if not args.online:     # the flags' precision and layout; --online keeps the profile's, as dvc repro trains it
        training = training.model_copy(update={"bf16": args.bf16, "channels_last": args.channels_last})
    bench = synthetic_benchmark(spec, preset)
    train_transform, test_transform = KINDS[training.kind].transforms(bench, training)
    torch.manual_seed(0)
    net = build_backbone(training.backbone, bench["input_shape"], bench["n_classes"],
                         channels_last=training.channels_last, width=training.width).to(device).train()
    ctx = MethodContext(device=device, n_classes=bench["n_classes"], train_transform=train_transform,
                        generator=torch.Generator().manual_seed(0), epochs=1, plain_transform=test_transform)
    method = METHODS[run.algorithm](net, run, ctx)
    first, second = (Batches(bench, t, run.batch, device) for t in (0, 1))
    boundaries = method.needs_boundaries

    precision = training.bf16

    def observe(batches):
        x_raw, y = batches()
        with autocast(device, precision):
            return method.step(train_transform(x_raw), y, x_raw)

    with autocast(device, precision):
        if boundaries:
            method.begin_task(first.task)
    for _ in range(args.warmup):
        observe(first)
    with autocast(device, precision):
        if boundaries:
            method.end_task(first.task)
            method.begin_task(second.task)
    observe(second)
    total = torch.zeros((), device=device)

    def step():
        nonlocal total
        total += observe(second)   # kept on the device: no host synchronisation per step

    # --online: the bare loop puts through the network what the step does, the stream and the replayed batch
    images = run.batch + (getattr(run, "replay_batch", 0) if args.online and method.uses_buffer else 0)
    return step, images, key, training


def bare_loop(batch: int, preset: Preset, args, device: torch.device, width: int | None = None):
    """Plain PyTorch on the same backbone: forward, cross-entropy, backward, SGD on a pre-augmented batch. With
    --online it is the reference the issue sets: fp32 and the default memory layout, whatever the run uses."""
    torch.manual_seed(0)
    image = SOURCE_SHAPES[preset.source].image
    channels_last, bf16 = (False, False) if args.online else (args.channels_last, args.bf16)
    net = build_backbone(args.backbone, image, CLASSES, channels_last=channels_last, width=width).to(device).train()
    params = list(net.parameters())
    g = torch.Generator().manual_seed(0)
    x = torch.randn((batch, *image), generator=g).to(device)
    y = torch.randint(0, CLASSES, (batch,), generator=g).to(device)
    total = torch.zeros((), device=device)

    def step():
        nonlocal total
        with autocast(device, bf16):
            loss = F.cross_entropy(net(x), y)
        for p in params:
            p.grad = None
        loss.backward()
        with torch.no_grad():   # plain SGD as one multi-tensor op (torch.optim.SGD's own overhead left out)
            torch._foreach_add_(params, [p.grad for p in params], alpha=-0.03)
        total += loss.detach()

    return step


def measure(loops: dict, steps: int, rounds: int, device: torch.device) -> dict[str, float]:
    """Seconds per step of every loop; the loops take turns, `steps` steps each per round."""
    spent = dict.fromkeys(loops, 0.0)
    for _ in range(rounds):
        for name, step in loops.items():
            sync(device)
            start = time.perf_counter()
            for _ in range(steps):
                step()
            sync(device)
            spent[name] += time.perf_counter() - start
    return {name: s / (steps * rounds) for name, s in spent.items()}


def benchmark_device(device: torch.device, args) -> list[dict]:
    preset = PRESETS["online" if args.online else args.backbone]
    preset = dataclasses.replace(preset, benchmark=args.benchmark or preset.benchmark, buffer=args.buffer or preset.buffer)
    params = load_params(args.profile or preset.profile)
    methods = args.methods or sorted(METHODS)
    loops, batch_of, runs, settings = {}, {}, {}, {}
    for name in methods:
        if name not in METHODS:
            print(f"[skip] method {name!r} is not registered in gcl.methods.METHODS", file=sys.stderr)
            continue
        key, base = timed_run(params, preset, name)
        if key is None:
            print(f"[skip] {name}: no run of it in {args.profile or preset.profile} on a {args.backbone} benchmark",
                  file=sys.stderr)
            continue
        loops[name], batch_of[name], runs[name], settings[name] = method_loop(key, params, preset, args, device,
                                                                              algorithm=name if base else None)
        if base:
            runs[name] = f"{key} as {name}"
    width = next(iter(settings.values())).width if settings else None     # one benchmark: one network
    for batch in sorted(set(batch_of.values())):
        loops[f"bare/{batch}"] = bare_loop(batch, preset, args, device, width)
    for step in loops.values():   # warm-up: allocations, first-call costs
        step()
    seconds = measure(loops, args.steps or preset.steps[device.type], args.rounds, device)
    rows = []
    for name, batch in batch_of.items():
        bare = seconds[f"bare/{batch}"]
        rows.append({"method": name, "run": runs[name], "batch": batch, "seconds": seconds[name],
                     "ms_per_sample": 1e3 * seconds[name] / batch, "bare_ms_per_sample": 1e3 * bare / batch,
                     "vs_bare": seconds[name] / bare, "device": device.type,
                     "precision": "bf16" if settings[name].bf16 else "fp32",
                     "layout": "channels_last" if settings[name].channels_last else "nchw", "backbone": args.backbone,
                     "width": settings[name].width})
    return rows


def print_table(rows: list[dict], args) -> None:
    preset = PRESETS["online" if args.online else args.backbone]
    print(f"{args.backbone} on {args.benchmark or preset.benchmark} shapes; torch {torch.__version__}, "
          f"{torch.get_num_threads()} CPU thread(s); {args.rounds} rounds of {args.steps or preset.steps['cpu']} steps")
    if args.online:
        print("online: each method as its run trains (precision, layout, width of the profile); the bare loop in fp32 "
              "and the default layout, at the images a step puts through the network (stream + replayed batch)")
    head = (f"{'device':<7}{'precision':<10}{'layout':<14}{'method':<11}{'batch':>6}{'ms/step':>10}{'ms/sample':>11}"
            f"{'bare ms/sample':>16}{'vs bare':>9}  run")
    print(head)
    print("-" * len(head))
    for r in sorted(rows, key=lambda r: (r["device"], r["vs_bare"])):
        print(f"{r['device']:<7}{r['precision']:<10}{r['layout']:<14}{r['method']:<11}{r['batch']:>6}"
              f"{1e3 * r['seconds']:>10.2f}{r['ms_per_sample']:>11.3f}{r['bare_ms_per_sample']:>16.3f}"
              f"{r['vs_bare']:>8.2f}x  {r['run']}")


def main(argv=None) -> list[dict] | None:
    p = argparse.ArgumentParser(prog="python -m gcl.bench steps", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backbone", choices=sorted(PRESETS), default="mlp")
    p.add_argument("--methods", default="", help="comma-separated registered methods (default: all)")
    p.add_argument("--profile", default=None, help="params file whose runs give the settings (default: the preset's)")
    p.add_argument("--benchmark", default=None, help="the profile's benchmark whose runs are timed (default: the preset's)")
    p.add_argument("--buffer", type=int, default=None, help="the buffer whose runs are preferred (default: the preset's)")
    p.add_argument("--steps", type=int, default=None, help="timed steps per loop and round (default: the preset's)")
    p.add_argument("--rounds", type=int, default=3, help="rounds in which the loops take turns")
    p.add_argument("--warmup", type=int, default=3, help="steps of the first task before the timed second task")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="cpu",
                   help="auto: CPU, and CUDA too where present")
    p.add_argument("--bf16", action="store_true", help="bf16 autocast around every step")
    p.add_argument("--channels-last", action="store_true", help="NHWC weights and activations (resnet18)")
    p.add_argument("--threads", type=int, default=None, help="CPU intra-op threads (default: torch's)")
    p.add_argument("--online", action="store_true", help="the online profile (profiles/online-cifar10.yaml): its ER "
                   "step (or --methods) as its run trains, against a bare fp32 loop in the default layout")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a setting of every timed method "
                   "that declares it, over its run's (YAML value; repeatable), e.g. star_samples=all")
    p.add_argument("--cell", default=None, help="time one seed of this run key of params.yaml instead")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--stacked", type=int, default=0, metavar="S", help="time S seeds trained stacked against the same "
                   "seeds alone, for every stackable method (MLP: MNIST-360; resnet18: seq-CIFAR-10)")
    p.add_argument("--per-class", type=int, default=None, help="with --stacked: random images per class (default: "
                   "400 digits, the bundled digits' stream; 8 images for resnet18)")
    p.add_argument("--width", type=int, default=None, help="with --stacked and resnet18: the network's width "
                   "(default: 64, the architecture's)")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.cell:
        time_cell(args)
        return None
    if args.stacked:
        args.methods = split(args.methods)
        args.per_class = args.per_class or {"mlp": 400, "resnet18": 8}[args.backbone]
        return stacked_table(args)
    if args.online:
        if args.bf16 or args.channels_last:
            p.error("--online times each method at its profile's precision and layout; edit the profile to try others")
        args.backbone, args.methods = "resnet18", args.methods or "er"
    if args.channels_last and args.backbone != "resnet18":
        p.error("--channels-last applies to --backbone resnet18")
    args.methods = split(args.methods)
    devices = {"auto": ["cpu"] + (["cuda"] if torch.cuda.is_available() else []), "cpu": ["cpu"], "cuda": ["cuda"]}
    rows = []
    for name in devices[args.device]:
        rows += benchmark_device(torch.device(name), args)
    print_table(rows, args)
    return rows

