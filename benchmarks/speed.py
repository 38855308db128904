"""Training speed on seq-cifar10 shapes: ER and DER++ steps beside a bare PyTorch loop.

    python benchmarks/speed.py                          # CPU, and CUDA where present; fp32
    python benchmarks/speed.py --bf16 --channels-last   # bf16 autocast, NHWC weights and activations
    python benchmarks/speed.py --cell seq-mnist-er-200  # time one seed of one cell of params.yaml

A method step is what the training loop does per stream batch: batched augmentation of 32 stream
images, `observe` (32 stream + 32 replayed examples, augmented afresh, reservoir insertion, one SGD
update). The bare loop is a forward/backward/SGD step of the same ResNet-18 on a batch of 64
already-augmented images of the same data: the overhead ratio is what the framework costs above
the network's own compute. DER++ makes three forward passes (stream, logit replay, label replay)
of 32 each where ER makes one of 64, so its ratio includes that extra work by design.
Data are random uint8 images of the real shape; only the timing is of interest. The loops take
turns in a few rounds and the median round is reported, so that load from other processes on a
shared machine skews all of them alike.
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time

import torch
import torch.nn.functional as F

from gcl.backbones import ResNet18
from gcl.data.augment import Normalize, TrainAugment
from gcl.data.image_sources import NORMALIZATION
from gcl.settings import defaults
from gcl.methods import METHODS, MethodContext

STREAM, REPLAY, CLASSES, SHAPE = 32, 32, 10, (3, 32, 32)
# DER's seq-cifar10 settings (docs/protocol.md) for whatever the methods require
HPARAMS = {"lr": 0.03, "batch": STREAM, "replay_batch": REPLAY, "alpha": 0.1, "beta": 0.5}


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def autocast(device: torch.device, bf16: bool):
    return torch.autocast(device.type, dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()


def make_data(n: int, device: torch.device, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 256, (n, *SHAPE), dtype=torch.uint8, generator=g)
    y = torch.randint(0, CLASSES, (n,), generator=g)
    return x.to(device), y.to(device)


def bare_loop(x, y, args, device):
    """Plain PyTorch: the same network and batches of 64, augmented beforehand, plain SGD."""
    torch.manual_seed(0)
    net = ResNet18(SHAPE, CLASSES, channels_last=args.channels_last).to(device).train()
    opt = torch.optim.SGD(net.parameters(), lr=HPARAMS["lr"])
    augment = TrainAugment(Normalize(*NORMALIZATION["cifar10"]))
    batch = STREAM + REPLAY
    inputs = [augment(x[i * STREAM:i * STREAM + batch]) for i in range(args.n_batches)]
    labels = [y[i * STREAM:i * STREAM + batch] for i in range(args.n_batches)]
    total = torch.zeros((), device=device)

    def step(i):
        nonlocal total
        with autocast(device, args.bf16):
            loss = F.cross_entropy(net(inputs[i]), labels[i])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        total += loss.detach()   # kept on the device: no host synchronisation per step

    return step


def method_loop(name: str, x, y, args, device):
    """The training loop's per-step work for method `name` (train.py: augment, then observe)."""
    cls = METHODS[name]
    fields = cls.Settings.model_fields
    missing = [k for k, f in fields.items() if f.is_required() and k not in HPARAMS]
    if missing:
        raise KeyError(f"{name} needs {missing}, which this benchmark does not set")
    cfg = {**defaults(cls.Settings), **{k: HPARAMS[k] for k in fields if k in HPARAMS},
           "buffer": args.buffer if cls.uses_buffer else "none"}
    torch.manual_seed(0)
    net = ResNet18(SHAPE, CLASSES, channels_last=args.channels_last).to(device).train()
    augment = TrainAugment(Normalize(*NORMALIZATION["cifar10"]))
    ctx = MethodContext(device=device, n_classes=CLASSES, train_transform=augment,
                        generator=torch.Generator().manual_seed(0), epochs=1)
    method = cls(net, cfg, ctx)
    total = torch.zeros((), device=device)

    def step(i):
        nonlocal total
        x_raw, labels = x[i * STREAM:(i + 1) * STREAM], y[i * STREAM:(i + 1) * STREAM]
        with autocast(device, args.bf16):
            total += method.observe(augment(x_raw), labels, x_raw)

    return step


def benchmark_device(device: torch.device, args) -> list[dict]:
    """Seconds per step of every loop: after `warmup` steps each (which also fill the buffers), `rounds`
    rounds in which every loop runs `steps` steps in turn, synchronised at the ends of each run; the
    median round counts, so a burst of load from elsewhere on the machine hits all loops alike."""
    steps = args.steps or (1 if device.type == "cpu" else 50)
    args.n_batches = args.warmup + steps * args.rounds
    x, y = make_data((args.n_batches + 1) * STREAM + REPLAY, device)
    loops = {"bare": bare_loop(x, y, args, device)}
    for name in args.methods:
        if name not in METHODS:
            print(f"[skip] method {name!r} is not registered in gcl.methods.METHODS", file=sys.stderr)
            continue
        loops[name] = method_loop(name, x, y, args, device)
    for step in loops.values():
        for i in range(args.warmup):
            step(i)
    times = {name: [] for name in loops}
    for r in range(args.rounds):
        first = args.warmup + r * steps
        for name, step in loops.items():
            sync(device)
            start = time.perf_counter()
            for i in range(first, first + steps):
                step(i)
            sync(device)
            times[name].append((time.perf_counter() - start) / steps)
    return [{"loop": name, "seconds": statistics.median(t), "device": device.type,
             "precision": "bf16" if args.bf16 else "fp32", "layout": "channels_last" if args.channels_last else "nchw"}
            for name, t in times.items()]


def print_table(rows: list[dict], args) -> None:
    print(f"seq-cifar10 shapes, ResNet-18, {STREAM} stream + {REPLAY} replayed per step; torch {torch.__version__}, "
          f"{torch.get_num_threads()} CPU thread(s); median of {args.rounds} rounds after {args.warmup} warm-up step(s)")
    head = f"{'device':<7}{'precision':<10}{'layout':<14}{'loop':<7}{'ms/step':>10}{'stream samples/s':>18}{'vs bare':>9}"
    print(head)
    print("-" * len(head))
    bare = {r["device"]: r["seconds"] for r in rows if r["loop"] == "bare"}
    for r in rows:
        ratio = r["seconds"] / bare[r["device"]]
        print(f"{r['device']:<7}{r['precision']:<10}{r['layout']:<14}{r['loop']:<7}{1e3 * r['seconds']:>10.1f}"
              f"{STREAM / r['seconds']:>18.1f}{ratio:>8.2f}x")


def time_cell(args) -> None:
    """One seed of one params.yaml cell, as `dvc repro` would train it, without writing anything."""
    from gcl.config import load_params, resolve_benchmark, resolve_run
    from gcl.data.benchmarks import load_benchmark
    from gcl.layout import benchmark_file
    from gcl.devices import resolve_device
    from gcl.train import run_seed

    params = load_params(args.params)
    spec = resolve_run(params, args.cell)
    run_cfg, bench_cfg = spec["run"], spec["benchmark"]
    torch.set_num_threads(resolve_benchmark(params, run_cfg["benchmark"])["runtime"]["threads"])
    device = resolve_device(spec["device"])
    bench = load_benchmark(benchmark_file(run_cfg["benchmark"]), spec["data"])
    r = run_seed(bench, bench_cfg, run_cfg, args.seed, device)
    til = "-" if r["task_il"] is None else f"{r['task_il']:.2f}"
    print(f"{args.cell} seed {args.seed} on {device.type} ({torch.get_num_threads()} threads): {r['steps']} steps, "
          f"{r['train_seconds']:.1f} s training, {r['samples_per_second']:.0f} samples/s, "
          f"{1e3 * r['train_seconds'] / r['steps']:.1f} ms/step; class-il {r['class_il']:.2f}, task-il {til}")


def main(argv=None) -> list[dict] | None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=None, help="timed steps per loop and round (default: 1 on CPU, 50 on CUDA)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds; the median counts")
    p.add_argument("--warmup", type=int, default=1, help="untimed steps first; they also prime the buffer")
    p.add_argument("--methods", default="er,derpp", help="comma-separated registered methods")
    p.add_argument("--buffer", type=int, default=500)
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                   help="auto: CPU, and CUDA too where present")
    p.add_argument("--bf16", action="store_true", help="bf16 autocast around forward and loss")
    p.add_argument("--channels-last", action="store_true", help="NHWC weights and activations")
    p.add_argument("--threads", type=int, default=None, help="CPU intra-op threads (default: torch's)")
    p.add_argument("--cell", default=None, help="time one seed of this run key of params.yaml instead")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--params", default="params.yaml")
    args = p.parse_args(argv)
    if args.cell:
        time_cell(args)
        return None
    if args.warmup < 1:
        p.error("--warmup must be at least 1: the first step fills the buffer that later steps replay")
    args.methods = [m for m in args.methods.split(",") if m]
    if args.threads:
        torch.set_num_threads(args.threads)
    devices = {"auto": ["cpu"] + (["cuda"] if torch.cuda.is_available() else []), "cpu": ["cpu"], "cuda": ["cuda"]}
    rows = []
    for name in devices[args.device]:
        rows += benchmark_device(torch.device(name), args)
    print_table(rows, args)
    return rows


if __name__ == "__main__":
    main()
