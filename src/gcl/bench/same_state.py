"""`python -m gcl.bench same-state`: whether two checkouts' train code computes the same seed: the evidence for
carrying a finished run from one commit's workspace to another's (`dvc commit -f`) instead of training it again.

    # in a workspace (its params.yaml and data/benchmarks/), once with each checkout's library:
    python -m gcl.bench same-state save <run> <seed> old.pt --code <old checkout>
    python -m gcl.bench same-state save <run> <seed> new.pt --code <new checkout>
    python -m gcl.bench same-state compare old.pt new.pt

`save` trains one seed of a run of params.yaml as its train stage would (same benchmark file, settings, compile mode,
one thread) up to its first task's end, where the training loop writes a checkpoint, and saves that state: the
method's (network, BatchNorm statistics, buffer, its own attributes), the loop's (step, evaluations, loss sums) and
every random state.
`compare` prints every tensor or value that differs (timings aside) and exits 1 if any does, 0 if none (and says how
many tensors and numbers it compared). The same state after a task means the same function of the same inputs so far,
not a proof for the steps after; the closing note says how far it was run. The loop's other checkpoints (every
`checkpoint_minutes`) are not taken: they fall on whatever step the clock reaches, another in each process. A run
without a task-end checkpoint (a task-free stream such as MNIST-360, or an offline method such as JOINT, whose
checkpoints are not taken at task ends) has no such point, and `save` refuses it.

`--code <checkout>` trains with that checkout's library (its src/gcl, which need not hold this module: an older commit
may predate it), in a process of its own that runs this file with the checkout's src/ first on PYTHONPATH; without
it, with the library this module belongs to. `save` names the library it used.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import torch


class _Saved(Exception):
    """Raised by the checkpoint once it has written the state: the seed stops there."""


def first_task_end(checkpoint_class: type) -> type:
    """A subclass of the library's Checkpoint that saves the state at the first task end, to `path` itself, and stops
    the seed there (_Saved): never on the clock, never resuming."""
    class FirstTaskEnd(checkpoint_class):
        def due(self, task_ended: bool) -> bool:
            return task_ended

        def load(self, say):
            return None

        def save(self, state: dict) -> None:
            torch.save(state, self.path)
            raise _Saved

    return FirstTaskEnd


def save(run_key: str, seed: int, out: Path) -> None:
    from gcl.config import load_params, resolve_run
    from gcl.core.devices import resolve_device
    from gcl.core.layout import benchmark_file
    from gcl.data.benchmarks import load_benchmark
    from gcl.methods import METHODS
    from gcl.training.checkpoint import Checkpoint
    from gcl.training.compilation import compile_mode
    from gcl.training.train import run_seed

    torch.set_num_threads(1)
    params = load_params()
    spec = resolve_run(params, run_key)
    device = resolve_device(spec.device)
    bench = load_benchmark(str(benchmark_file(spec.run.benchmark)), spec.data)
    compiled = compile_mode(spec.benchmark.compile, device, METHODS[spec.run.algorithm])
    try:
        run_seed(bench, spec.benchmark, spec.run, seed, device, 0, None,
                 first_task_end(Checkpoint)(out, "-", float("inf")), compiled)
    except _Saved:
        import gcl
        print(f"saved {out}: {run_key}, seed {seed}, at its first task's end (library: {Path(gcl.__file__).parent})")
        return
    sys.exit(f"error: {run_key} seed {seed} finished without a task-end checkpoint (a task-free stream such as "
             "MNIST-360, or an offline method such as JOINT), so there is no step both checkouts stop at; "
             "compare the runs' metrics.json instead")


def save_with(code: Path, run_key: str, seed: int, out: Path) -> int:
    """`save` with checkout `code`'s library: this file run as a script (so that no copy of this module is needed
    there) in a process whose PYTHONPATH puts `code`/src first; its exit status."""
    src = code.resolve() / "src"
    if not (src / "gcl").is_dir():
        sys.exit(f"error: --code {code}: no src/gcl there (a checkout of this project)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src), *filter(None, [os.environ.get("PYTHONPATH")])])}
    return subprocess.run([sys.executable, __file__, "save", run_key, str(seed), str(out)], env=env).returncode


def differences(a, b, path: str = ""):
    """Every place where two saved states differ: tensors by value, dtype and shape, the rest by equality; timings
    (a key holding 'seconds' or 'time') are skipped."""
    if any(word in path.rsplit("/", 1)[-1].lower() for word in ("seconds", "time")):
        return
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype
                and a.shape == b.shape and torch.equal(a, b)):
            yield path or "/"
    elif isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(a.keys() ^ b.keys(), key=str):
            yield f"{path}/{key} (in one state only)"
        for key in sorted(a.keys() & b.keys(), key=str):
            yield from differences(a[key], b[key], f"{path}/{key}")
    elif isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and len(a) == len(b):
        for i, (u, v) in enumerate(zip(a, b)):
            yield from differences(u, v, f"{path}[{i}]")
    elif a != b:
        yield f"{path or '/'}: {a!r} != {b!r}"


def tensors(state) -> tuple[int, int]:
    """(tensors, numbers) a state holds."""
    if isinstance(state, torch.Tensor):
        return 1, state.numel()
    items = state.values() if isinstance(state, dict) else state if isinstance(state, (list, tuple)) else ()
    counts = [tensors(item) for item in items]
    return sum(c[0] for c in counts), sum(c[1] for c in counts)


def compare(first: Path, second: Path) -> int:
    a, b = (torch.load(path, map_location="cpu", weights_only=True) for path in (first, second))
    found = list(differences(a, b))
    n, numbers = tensors(a)
    if found:
        print(f"{len(found)} difference(s) between {first} and {second}:")
        print("\n".join(f"  {d}" for d in found[:50]))
        return 1
    print(f"the same state: {n} tensors ({numbers:,} numbers) and every other value equal")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gcl.bench same-state", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("save", help="train a seed to its first task's end and save the state")
    s.add_argument("run")
    s.add_argument("seed", type=int)
    s.add_argument("out", type=Path)
    s.add_argument("--code", type=Path, default=None, help="a checkout whose library trains the seed (default: this "
                   "module's)")
    c = sub.add_parser("compare", help="compare two saved states")
    c.add_argument("first", type=Path)
    c.add_argument("second", type=Path)
    args = parser.parse_args(argv)
    if args.command == "save":
        if args.code is not None:
            return save_with(args.code, args.run, args.seed, args.out)
        save(args.run, args.seed, args.out)
        return 0
    return compare(args.first, args.second)


if __name__ == "__main__":     # run as a script by save_with, under another checkout's library
    sys.exit(main())
