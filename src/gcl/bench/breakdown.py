"""`python -m gcl.bench breakdown`: where the wall time of a cold `dvc repro` goes: DVC, Python start-up, training,
the rest of each stage.

    python -m gcl.bench breakdown                 # a fresh clone of this repository's HEAD, default profile
    python -m gcl.bench breakdown --repeat 3      # three cold runs: best and worst wall time
    python -m gcl.bench breakdown --params profiles/ci.yaml
    python -m gcl.bench breakdown --rev 48af4a6   # an earlier commit, timed on this machine (before/after)
    python -m gcl.bench breakdown --params profiles/mnist-360.yaml --downloads ~/mnist-files --keep-results out/

The repository is the current folder's (the project's root), or --root's; --params names a file in it. Each run
clones HEAD into a temporary folder (no outputs, no DVC cache: what a new user has), runs
`dvc repro` there and time-stamps every line it prints. The lines mark the phases: DVC announces a stage
("Running stage") and its command ("> python ..."); a train stage says when its settings are read and its
seeds start ("[run] 3 seed(s) to train"), reports each seed's training seconds ("done: ... in 4.2s"), and
prints its metrics.json path as it ends; DVC says when it takes over again ("Updating lock file"). So, per stage:

    dvc        from "Running stage" to the command, and from the command's end to the next stage (checking
               dependencies, hashing and caching outputs, rewriting dvc.lock)
    start-up   from the command to its first line of work (interpreter, imports, settings; train stages)
    seeds      from there to the stage's end: the seeds in their processes (loading the benchmark, training,
               evaluating) and writing the results; `training` is the sum of the seeds' own training seconds
               (CPU-side, over parallel processes), the rest of the wall time evaluation, loading and writing

Other stages (check, prepare, benchmark, report) count whole as their kind.

The machine this runs on may be shared: before and after each run a fixed reference workload (an MLP step)
is timed, so that a slow run can be told from a slow moment of the machine.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

RUNNING = re.compile(r"^Running stage '(?P<stage>[^']+)':")
CACHED = re.compile(r"^Stage '(?P<stage>[^']+)' is cached")
COMMAND = re.compile(r"^> ")
READY = re.compile(r"^\[(?P<run>[^\] ]+)\] \d+ seed\(s\) to train")
DONE = re.compile(r"^\[(?P<run>[^\] ]+) seed \d+\] done: class-il [\d.]+ in (?P<seconds>[\d.]+)s")


def timed_lines(cmd: list[str], cwd: Path, env: dict) -> tuple[list[tuple[float, str]], float]:
    """Run `cmd`, returning every output line with the seconds since the start at which it arrived."""
    start = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            bufsize=1)
    lines = [(time.monotonic() - start, line.rstrip("\n")) for line in proc.stdout]
    if proc.wait() != 0:
        tail = "\n".join(text for _, text in lines[-30:])
        raise SystemExit(f"{' '.join(cmd)} failed in {cwd}:\n{tail}")
    return lines, time.monotonic() - start


def parse(lines: list[tuple[float, str]], total: float) -> list[dict]:
    """Per stage: its kind, method (train stages), and the seconds of each phase."""
    stages, current = [], None
    for t, text in lines:
        if m := RUNNING.match(text) or CACHED.match(text):
            if current:
                current["end"] = t
            current = {"stage": m["stage"], "start": t, "cmd": None, "ready": None, "done": None, "training": 0.0,
                       "locked": False}
            stages.append(current)
            continue
        if current is None:
            continue
        if text.startswith("Updating lock file"):
            current["locked"] = True    # DVC's again: the command's outputs are saved
        elif current["cmd"] is None:
            if COMMAND.match(text):
                current["cmd"] = t
        elif not current["locked"]:
            current["done"] = t         # the command's latest line so far
            if READY.match(text) and current["ready"] is None:
                current["ready"] = t
            elif m := DONE.match(text):
                current["training"] += float(m["seconds"])
    if current:
        current["end"] = total
    out = []
    for s in stages:
        kind = s["stage"].split("@")[0]
        cmd = s["cmd"] if s["cmd"] is not None else s["end"]
        finished = s["done"] if s["done"] is not None else s["end"]
        row = {"stage": s["stage"], "kind": kind, "dvc": (cmd - s["start"]) + (s["end"] - finished),
               "start-up": 0.0, "seeds": 0.0, "training": s["training"], "other": 0.0}
        if kind == "train" and s["ready"] is not None:
            row["start-up"] = s["ready"] - cmd
            row["seeds"] = finished - s["ready"]
        else:
            row["other"] = finished - cmd
        out.append(row)
    return out


def machine_speed(batch: int = 10, steps: int = 300, repeats: int = 3) -> float:
    """Milliseconds per step of a fixed reference (the default profile's MLP, SGD, one thread, `batch` images),
    median of `repeats`: the shared machine's speed at that moment, so that runs measured at different times
    compare. At batch 10 a step is mostly dispatch overhead, at batch 800 mostly matrix products."""
    import torch
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        g = torch.Generator().manual_seed(0)
        x, y = torch.rand(batch, 784, generator=g), torch.randint(0, 10, (batch,), generator=g)
        net = torch.nn.Sequential(torch.nn.Linear(784, 100), torch.nn.ReLU(), torch.nn.Linear(100, 100),
                                  torch.nn.ReLU(), torch.nn.Linear(100, 10))
        opt = torch.optim.SGD(net.parameters(), lr=0.01)
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            for _ in range(steps):
                opt.zero_grad()
                torch.nn.functional.cross_entropy(net(x), y).backward()
                opt.step()
            times.append((time.perf_counter() - start) / steps * 1000)
        return statistics.median(times)
    finally:
        torch.set_num_threads(threads)


def machine_probe() -> tuple[float, float]:
    """(ms per reference step at batch 10, at batch 800)."""
    return machine_speed(10, 300), machine_speed(800, 30)


def fresh_clone(root: Path, dst: Path, params: str | None, rev: str | None = None,
                downloads: Path | None = None) -> None:
    """A clone of repository `root`'s HEAD (or `rev`), `params` (a file of `root`) over its params.yaml, `downloads`
    copied in as its data/downloads."""
    subprocess.run(["git", "clone", "-q", str(root), str(dst)], check=True)
    if rev:
        subprocess.run(["git", "-C", str(dst), "checkout", "-q", rev], check=True)
    if params:
        shutil.copy(root / params, dst / "params.yaml")
    if downloads:
        shutil.copytree(downloads, dst / "data" / "downloads")


def one_run(params: str | None, log: Path | None, rev: str | None = None, downloads: Path | None = None,
            keep_results: Path | None = None, root: Path = Path(".")) -> tuple[float, list[dict]]:
    """One cold `dvc repro` in a fresh clone of repository `root`: its wall time and phases; `keep_results` receives
    the clone's params.yaml, dvc.lock and results/ (what a committed reproduction holds)."""
    folder = Path(tempfile.mkdtemp(prefix="gcl-breakdown-"))
    try:
        repo = folder / "repo"
        fresh_clone(root.resolve(), repo, params, rev, downloads)
        env = {**os.environ, "PYTHONPATH": str(repo / "src"), "PYTHONUNBUFFERED": "1"}
        lines, total = timed_lines(["dvc", "repro"], repo, env)
        if log:
            log.write_text("".join(f"{t:9.2f} {text}\n" for t, text in lines))
        if keep_results:
            shutil.rmtree(keep_results, ignore_errors=True)
            keep_results.mkdir(parents=True)
            for name in ("params.yaml", "dvc.lock"):
                shutil.copy(repo / name, keep_results / name)
            shutil.copytree(repo / "results", keep_results / "results")
        return total, parse(lines, total)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def summary(total: float, rows: list[dict], probe: tuple[tuple[float, float], tuple[float, float]] | None = None) -> str:
    by_kind = defaultdict(lambda: defaultdict(float))
    for r in rows:
        for k in ("dvc", "start-up", "seeds", "training", "other"):
            by_kind[r["kind"]][k] += r[k]
        by_kind[r["kind"]]["stages"] += 1
    lines = [f"cold `dvc repro`: {total:.1f} s wall, {len(rows)} stages",
             f"{'kind':<10}{'stages':>7}{'dvc':>9}{'start-up':>10}{'seeds':>9}{'(training)':>12}{'other':>9}"]
    for kind, v in by_kind.items():
        lines.append(f"{kind:<10}{int(v['stages']):>7}{v['dvc']:>9.1f}{v['start-up']:>10.1f}{v['seeds']:>9.1f}"
                     f"{v['training']:>12.1f}{v['other']:>9.1f}")
    accounted = sum(r["dvc"] + r["start-up"] + r["seeds"] + r["other"] for r in rows)
    lines.append(f"{'all':<10}{len(rows):>7}{sum(v['dvc'] for v in by_kind.values()):>9.1f}"
                 f"{sum(v['start-up'] for v in by_kind.values()):>10.1f}{sum(v['seeds'] for v in by_kind.values()):>9.1f}"
                 f"{sum(v['training'] for v in by_kind.values()):>12.1f}{sum(v['other'] for v in by_kind.values()):>9.1f}"
                 f"   (DVC before the first stage: {total - accounted:.1f} s)")
    train = [r for r in rows if r["kind"] == "train"]
    if train:
        per = [r["dvc"] + r["start-up"] for r in train]
        lines.append(f"per train stage: dvc + start-up {statistics.median(per):.2f} s (median); seeds wall "
                     f"{statistics.median([r['seeds'] for r in train]):.2f} s (median)")
        slow = sorted(train, key=lambda r: -(r["dvc"] + r["start-up"] + r["seeds"]))[:8]
        lines.append("slowest train stages (wall s, training s summed over seeds): " + ", ".join(
            f"{r['stage'][6:]} {r['dvc'] + r['start-up'] + r['seeds']:.1f} ({r['training']:.1f})" for r in slow))
    if probe:
        (small0, large0), (small1, large1) = probe
        lines.append(f"machine speed (reference MLP step, one thread; higher = a slower machine at that moment): "
                     f"batch 10 {small0:.3f} ms before the run, {small1:.3f} ms after; "
                     f"batch 800 {large0:.2f} ms before, {large1:.2f} ms after")
    return "\n".join(lines)


def main(argv=None) -> list[tuple[float, list[dict]]]:
    p = argparse.ArgumentParser(prog="python -m gcl.bench breakdown", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--root", type=Path, default=Path("."), help="the repository cloned (default: the current folder)")
    p.add_argument("--repeat", type=int, default=1, help="cold runs, one after the other")
    p.add_argument("--params", default=None, help="a profile to copy over params.yaml in the clone (default: as committed)")
    p.add_argument("--log", type=Path, default=None, help="write the time-stamped output of the last run here")
    p.add_argument("--rev", default=None, help="clone this commit instead of HEAD (an earlier version, timed here)")
    p.add_argument("--downloads", type=Path, default=None, help="a folder copied in as the clone's data/downloads: "
                   "the sources' files where the machine cannot download them (e.g. MNIST/raw/ with the IDX files)")
    p.add_argument("--keep-results", type=Path, default=None, help="copy the last run's params.yaml, dvc.lock and "
                   "results/ here (replacing the folder)")
    args = p.parse_args(argv)
    if args.downloads and not args.downloads.is_dir():
        raise SystemExit(f"error: --downloads {args.downloads}: no such folder")
    if not (args.root / "dvc.yaml").is_file():
        raise SystemExit(f"error: {args.root.resolve()} holds no dvc.yaml: run from the project's root folder, or name "
                         "it with --root")
    if not args.rev and subprocess.run(["git", "-C", str(args.root), "status", "--porcelain", "--untracked-files=no"],
                                       capture_output=True, text=True).stdout.strip():
        print("note: the clone is of HEAD; uncommitted changes are not in it", file=sys.stderr)
    results = []
    for i in range(args.repeat):
        before = machine_probe()
        total, rows = one_run(args.params, args.log, args.rev, args.downloads, args.keep_results, args.root)
        time.sleep(10)   # DVC starts a short-lived background process as it exits: let it finish first
        probe = (before, machine_probe())
        results.append((total, rows))
        print(f"--- run {i + 1} of {args.repeat}")
        print(summary(total, rows, probe), flush=True)
    if args.repeat > 1:
        walls = [t for t, _ in results]
        print(f"best {min(walls):.1f} s, worst {max(walls):.1f} s, over {len(walls)} cold runs")
    return results

