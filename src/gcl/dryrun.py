"""Prove on a CPU that every run of a profile trains to the end, before anyone spends a GPU-hour on it.

    python -m gcl.dryrun profiles/paper.yaml                                # every run of the paper grid
    python -m gcl.dryrun profiles/paper.yaml --runs 'seq-cifar10-icarl-*' 'split-*'
    python -m gcl.dryrun profiles/paper.yaml --runs 'seq-cifar10-*' --bf16 --compile true

Each selected run is trained and reported through the real pipeline: `dvc repro` of the project's own
dvc.yaml, stages and code (those of the project in the current folder, or of --root) in a scratch workspace
(.dryrun/<profile>/ in the project, kept between calls so that a second call re-runs only what changed), on a
params.yaml derived from the profile that keeps the stream structure of the real run and cuts only cost that the
structure does not depend on:

kept:  every source's classes and image shape; the benchmarks' tasks and class orders; every run's method,
       settings, batch, replay batch and buffer; and every short batch of its stream: each class loses the
       same number of images, chosen so that every run's stream has the short batches of its real stream in
       the same order (each kind's batch_sizes, from the code that builds the stream). So every kind of stream step,
       short last batch, task end, epoch end, carry, evaluation point, checkpoint and boundary hook of the real
       run happens, in the same order, and every buffer fills before its stream ends;
cut:   the pixels (random, gcl.data.random_sources; the source is not downloaded); images per class, to about
       --scale of the real count (default 0.1; --scale 1 keeps the real counts, the real step counts); epochs
       (at most --epochs, default 2: enough for the second pass over a task); seeds (the profile's first, or
       its first --seeds: with 2 or more, the runs that stack train their seeds stacked and the report computes
       its intervals); the image backbone's width (--width) and its input, average-pooled to --pooled-size
       pixels a side before the network (9 pixels keep 2 x 2 positions in its last stage, see POOLED_SIZE); the
       evaluation set (--test-per-class images of each class); CN-DPM's experts (width 4, 2 latent samples) and
       sleep phases (--sleep-steps Adam steps each instead of thousands); oEWC's penalty weight (0: see NUMERICS).

The image counts are cut by default because a CPU would take days over the paper grid's real counts
(docs/dryrun.md: what it costs). What the cut can hide: a defect that depends on the absolute number of images
rather than on the remainders kept, such as an exemplar quota that fits a full class but not a cut one (iCaRL's
2,560 per class at buffer 5120 on seq-cifar10 exceeds the cut class, as 1,024 exceeds a real CIFAR-100 class), or
memory at full size. `--runs ... --scale 1` runs chosen cells at their real counts.

What it proves: the code paths of every run, its stages, checks and the report, run to the end on data of the
real sizes. What it does not (NOT_PROVEN, printed at the end): accuracy (random pixels, narrowed networks), the
seed-worker pool (and, with one seed, stacked seeds and the report's intervals), compiled steps, speed on a GPU
(python -m gcl.bench grid), numerical trouble at full width (a learning rate that diverges on real data), or memory
at full size.

One line per run (status, steps, seconds); the exit status is non-zero when any run failed, each named with its
one-line error (its whole output is in .dryrun/<profile>/logs/<run>.log).
"""
from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import fcntl
import fnmatch
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import yaml

from gcl.config import algorithm_of, benchmark_settings, load_params, resolve_run
from gcl.core.devices import available_cores
from gcl.core.layout import run_dir
from gcl.data.random_sources import SOURCE_SHAPES, shape_name, shape_of
from gcl.report.settings import Comparison

# the smallest input side at which the ResNet's last stage (three stride-2 convolutions: 9 -> 5 -> 3 -> 2) still
# has 2 x 2 positions, as it has 4 x 4 and more at the real sizes: at 1 x 1, BatchNorm in training mode refuses a
# batch of one image, which every real size accepts (FDR's end-of-task outputs met one at 4 x 4)
POOLED_SIZE = 9
# settings a narrow network makes numerically unstable, set where they are stable. oEWC's penalty step is stable
# while lr * 2 * e_lambda * max Fisher < 2, and a narrow network concentrates the Fisher on few weights, so at the
# published e_lambda it diverges at the widths a CPU can afford (docs/dryrun.md: the Fisher's size by width). At
# e_lambda 0 the Fisher is still computed at every task end and the penalty still computed and added to every
# step: every code path runs; only the numbers of a narrow network are left out.
NUMERICS = {"oewc": {"e_lambda": 0.0}}
# what the workspace copies of the project: the pipeline and everything its stages read
PROJECT_PARTS = ("dvc.yaml", ".dvcignore", ".dvc/config", "stages", "src", "reference", "reproductions", "profiles", "README.md")
# CN-DPM's sleep phases train a new expert for thousands of Adam steps; their count changes no code path
CNDPM_SLEEP = ("sleep_steps_vae", "sleep_steps_cls")
CNDPM_CUT = {"vae_width": 4, "vae_ext": 1, "cls_width": 4, "cls_ext": 1, "z_samples": 2}


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m gcl.dryrun", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("profile", type=Path, help="a params file (profiles/paper.yaml)")
    ap.add_argument("--runs", nargs="+", default=["*"], metavar="GLOB", help="runs whose keys match any of these "
                    "shell-style patterns (default: every run)")
    ap.add_argument("--one-per-method", action="store_true", help="of the selected runs, one per benchmark and "
                    "method implementation (its smallest buffer): every code path at a fraction of the cost")
    ap.add_argument("--device", default="cpu", help="cpu (default), cuda or cuda:N: where the runs train")
    ap.add_argument("--scale", type=float, default=0.1, help="share of each class's training images kept, about "
                    "(default 0.1; 1: the real counts)")
    ap.add_argument("--epochs", type=int, default=2, help="passes over each task at most (default 2)")
    ap.add_argument("--seeds", type=int, default=1, help="the profile's first seeds kept (default 1; 2 or more "
                    "train stackable runs' seeds stacked, as the real run does, and give the report its intervals)")
    ap.add_argument("--bf16", action="store_true", help="train with bf16 autocast (CPU autocast is real)")
    ap.add_argument("--compile", choices=["auto", "true", "false"], default=None,
                    help="the benchmarks' compile setting (default: the profile's)")
    ap.add_argument("--width", type=int, default=2, help="the ResNet's first-stage channels (default 2; 64 real)")
    ap.add_argument("--pooled-size", type=int, default=POOLED_SIZE, help="image side the ResNet's input is pooled to "
                    f"(default {POOLED_SIZE}; at least the image's side: not pooled)")
    ap.add_argument("--test-per-class", type=int, default=5, help="evaluation images per class (default 5)")
    ap.add_argument("--sleep-steps", type=int, default=10, help="CN-DPM's Adam steps per sleep phase (default 10)")
    ap.add_argument("--jobs", type=int, default=available_cores(), help="runs trained side by side "
                    "(default: the cores)")
    ap.add_argument("--root", type=Path, default=Path("."), help="the project whose pipeline, stages and code run "
                    "(the folder holding dvc.yaml; default: the current folder)")
    ap.add_argument("--workspace", type=Path, default=None, help="scratch project (default <root>/.dryrun/<profile>)")
    ap.add_argument("--fresh", action="store_true", help="delete the workspace first (default: reuse it, so DVC "
                    "re-runs only what changed)")
    args = ap.parse_args(argv)
    for name in ("scale", "epochs", "seeds", "width", "pooled_size", "test_per_class", "sleep_steps", "jobs"):
        if getattr(args, name) <= 0:
            ap.error(f"--{name.replace('_', '-')} must be positive")
    if args.scale > 1:
        ap.error("--scale must be at most 1")
    return args


# ------------------------------------------------------------------------ the dry profile

def selected_runs(params: dict, patterns: list[str], one_per_method: bool = False) -> list[str]:
    keys = [k for k in params["runs"] if any(fnmatch.fnmatchcase(k, p) for p in patterns)]
    if not keys:
        raise SystemExit(f"error: no run of the profile matches {' '.join(patterns)}")
    if one_per_method:
        first = {}
        for key in sorted(keys, key=lambda k: buffer_of(params["runs"][k])):
            run = params["runs"][key]
            first.setdefault((run["benchmark"], algorithm_of(params, run["method"])), key)
        keys = [k for k in keys if k in first.values()]
        keys += [k for k in compared_runs(params, keys) if k not in keys]
    return keys


def compared_runs(params: dict, keys: list[str]) -> list[str]:
    """The runs the report's comparisons need beside the selected ones: for a comparison whose method has a
    selected run, the runs of every method it is compared with at that run's buffer (so a selection of one run
    per method still renders each comparison at its smallest buffer)."""
    wanted = []
    for spec in (Comparison.model_validate(c) for c in (params.get("report") or {}).get("comparisons") or []):
        for key in keys:
            run = params["runs"][key]
            if (run["benchmark"], run["method"]) == (spec.benchmark, spec.method):
                wanted += [k for k, r in params["runs"].items() if r["benchmark"] == spec.benchmark
                           and r["method"] in spec.against and r["buffer"] == run["buffer"]]
    return list(dict.fromkeys(wanted))


def dry_profile(params: dict, keys: list[str], args: argparse.Namespace) -> dict:
    """The profile's params.yaml for a dry run of runs `keys` (see the module docstring for what changes)."""
    runs = {k: dict(params["runs"][k]) for k in keys}
    bench_names = sorted({r["benchmark"] for r in runs.values()})
    benchmarks, sources = {}, {}
    for name in bench_names:
        block = dict(params["benchmarks"][name])
        source = block["source"]
        block["source"] = f"random-{shape_name(params, source)}"
        sources[block["source"]] = {"train_per_class": None, "test_per_class": args.test_per_class}
        block["epochs"] = min(block["epochs"], args.epochs)
        if block["backbone"] == "resnet18":
            side = shape_of(params, source).image[1]
            block.update(width=args.width, input_size=args.pooled_size if args.pooled_size < side else None)
        if args.bf16:
            block["bf16"] = True
        if args.compile is not None:
            block["compile"] = {"auto": "auto", "true": True, "false": False}[args.compile]
        benchmarks[name] = block
    for run in runs.values():
        if "epochs" in run:
            run["epochs"] = min(run["epochs"], args.epochs)
        if params["benchmarks"][run["benchmark"]]["backbone"] == "resnet18":
            run.update(NUMERICS.get(algorithm_of(params, run["method"]), {}))
        if "seeds" in run:
            run["seeds"] = run["seeds"][:args.seeds]
    # cut as for the whole profile, whatever the selection: a run sees the same stream in every dry run
    for source, counts in cut_counts(params, params["runs"], args.scale, args.epochs).items():
        if f"random-{shape_name(params, source)}" in sources:
            sources[f"random-{shape_name(params, source)}"]["train_per_class"] = counts
    methods = {m: dict(params["methods"][m] or {}) for m in sorted({r["method"] for r in runs.values()})}
    for name, block in methods.items():
        if block.get("algorithm", name) == "cndpm":
            block.update({k: min(block.get(k, args.sleep_steps), args.sleep_steps) for k in CNDPM_SLEEP})
            block.update({k: min(block.get(k, v), v) for k, v in CNDPM_CUT.items()})
    # one process a run: its seeds train one after the other, or as one stacked group where the run stacks
    return {"seeds": params["seeds"][:args.seeds], "device": args.device, "workers": 1, "threads": 1, "mps": "off",
            "sources": sources, "benchmarks": benchmarks, "methods": methods, "runs": runs,
            "report": dry_report(params.get("report") or {}, runs, bench_names)}


def cut_counts(params: dict, runs: dict, scale: float, epochs_cap: int) -> dict[str, list[int] | None]:
    """Each source's training images per class in the dry run: the real counts less one cut `d` for every class,
    `d` the largest up to (1 - scale) of the smallest class for which every run's stream has the short batches of
    its real stream, in the same order (`short_batches`), and is longer than the run's buffer, so that every
    buffer fills. None: the real counts."""
    out = {}
    for source in sorted({params["benchmarks"][r["benchmark"]]["source"] for r in runs.values()}):
        if scale >= 1:
            out[source] = None
            continue
        real = list(shape_of(params, source).counts("train"))
        # the streams that differ: one per benchmark, batch and epochs (many runs share one), with the largest buffer
        streams: dict[tuple, int] = {}
        for r in runs.values():
            if params["benchmarks"][r["benchmark"]]["source"] == source:
                shape = (r["benchmark"], run_batch(params, r), run_epochs(params, r, epochs_cap))
                streams[shape] = max(streams.get(shape, 0), buffer_of(r))
        wanted = {shape: short_batches(params, *shape, real) for shape in streams}
        for d in range(int((1 - scale) * min(real)), -1, -1):
            counts = [n - d for n in real]
            if all(keeps_stream(params, shape, counts, wanted[shape], buffer) for shape, buffer in streams.items()):
                break
        out[source] = counts
    return out


def stream_batches(params: dict, benchmark: str, batch: int, epochs: int, counts: list[int]) -> list[int]:
    """The size of every batch of a run's stream on a source with these training images per class, from the code
    that builds the real stream (the benchmark kind's batch_sizes: validation part, class order and all)."""
    settings = benchmark_settings(params, benchmark)
    try:
        return type(settings).batch_sizes(counts, settings.data(), epochs, batch)
    except NotImplementedError:
        raise SystemExit(f"error: the dry run cannot cut the images of a {settings.kind!r} benchmark: its kind does not "
                         "say how its stream's batches follow from the images per class (batch_sizes); run with "
                         "--scale 1") from None


def short_batches(params: dict, benchmark: str, batch: int, epochs: int, counts: list[int]) -> list[int]:
    """The stream's batches shorter than `batch`, in stream order: the last of each pass over a task, and on
    MNIST-360 the last of each segment."""
    return [n for n in stream_batches(params, benchmark, batch, epochs, counts) if n != batch]


def keeps_stream(params: dict, shape: tuple, counts: list[int], wanted: list[int], buffer: int) -> bool:
    try:
        sizes = stream_batches(params, *shape, counts)
    except ValueError:          # too few images for the stream's structure (MNIST-360's six chunks of a digit)
        return False
    return sum(sizes) > buffer and [n for n in sizes if n != shape[1]] == wanted


def run_batch(params: dict, run: dict) -> int:
    return run.get("batch", (params["methods"][run["method"]] or {}).get("batch", 1))


def run_epochs(params: dict, run: dict, epochs_cap: int) -> int:
    return min(run.get("epochs", params["benchmarks"][run["benchmark"]]["epochs"]), epochs_cap)


def buffer_of(run: dict) -> int:
    return run["buffer"] if isinstance(run["buffer"], int) else 0


def dry_report(report: dict, runs: dict, bench_names: list[str]) -> dict:
    """The profile's report block, less what names runs or benchmarks outside the selection."""
    report = json.loads(json.dumps(report))
    report["benchmarks"] = {k: v for k, v in (report.get("benchmarks") or {}).items() if k in bench_names}
    visualise = report.get("visualise")
    if visualise:
        cells = {f"{r['method']}/{r['buffer']}" for r in runs.values() if r["benchmark"] == visualise["benchmark"]}
        visualise["cells"] = [c for c in visualise.get("cells", []) if c in cells]
        if not visualise["cells"]:
            del report["visualise"]
    sensitivity = report.get("sensitivity")
    if sensitivity:       # a sweep is drawn only when every one of its points is a selected run
        points = {r["method"] for r in runs.values()
                  if r["benchmark"] == sensitivity["benchmark"] and r["buffer"] == sensitivity["buffer"]}
        sensitivity["sweeps"] = [w for w in sensitivity["sweeps"] if set(w["methods"]) <= points]
        if not sensitivity["sweeps"]:
            del report["sensitivity"]
    buffers = {}
    for r in runs.values():
        buffers.setdefault((r["benchmark"], r["method"]), set()).add(str(r["buffer"]))
    # an ablation keeps the buffers at which every configuration is a selected run, and is dropped without one
    def ran_at(spec: dict, buffer: int) -> bool:
        return all(str(buffer) in buffers.get((spec["benchmark"], m), set()) for m in spec["configurations"])

    ablations = [{**spec, "buffers": [b for b in spec["buffers"] if ran_at(spec, b)]}
                 for spec in report.pop("ablation", None) or []]
    if ablations := [a for a in ablations if a["buffers"]]:
        report["ablation"] = ablations
    # a comparison is kept only where every method it names ran at each buffer of the compared method
    comparisons = [(c, Comparison.model_validate(c)) for c in report.get("comparisons") or []]
    report["comparisons"] = [
        c for c, spec in comparisons
        if (mine := buffers.get((spec.benchmark, spec.method)))
        and all(mine <= buffers.get((spec.benchmark, m), set()) for m in spec.against)]
    return report


# ------------------------------------------------------------------------ the workspace

def prepare_workspace(root: Path, workspace: Path, profile: dict, fresh: bool) -> None:
    """A copy of project `root`'s pipeline with the dry profile as its params.yaml, a git repository of its own."""
    if fresh and workspace.exists():
        shutil.rmtree(workspace)
    workspace.mkdir(parents=True, exist_ok=True)
    for part in PROJECT_PARTS:
        src, dst = root / part, workspace / part
        if dst.is_dir():
            shutil.rmtree(dst)
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "*.pyc"))
        elif src.exists():
            shutil.copy2(src, dst)
    (workspace / "params.yaml").write_text(yaml.safe_dump(profile, sort_keys=False))
    if not (workspace / ".git").exists():
        git(workspace, "init", "-q")
    # the project's files only: the outputs of an earlier call are DVC's, and DVC refuses outputs that git tracks
    git(workspace, "add", "-A", "params.yaml", *PROJECT_PARTS)
    git(workspace, "commit", "-qm", "dry run", "--allow-empty")


@contextlib.contextmanager
def only_dry_run(workspace: Path):
    """One dry run at a time in a workspace: a second would replace the code under the first one's stages."""
    workspace.mkdir(parents=True, exist_ok=True)
    with open(workspace.parent / f".{workspace.name}.lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise SystemExit(f"error: another dry run is using {workspace}: wait for it, or give this one another "
                             "--workspace") from None
        yield


def git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.email=dryrun@localhost", "-c", "user.name=dryrun", *args], cwd=cwd,
                   check=True, capture_output=True)


def environment(workspace: Path) -> dict:
    # the workspace's own copy of the package first, whatever is installed (DVC hashes that copy as the stages'
    # code); then the caller's PYTHONPATH, which may hold the packages themselves (a --target install of DVC)
    paths = [str(workspace / "src"), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}


def dvc(workspace: Path, *args: str, log: Path | None = None) -> subprocess.CompletedProcess:
    done = subprocess.run(["dvc", *args], cwd=workspace, env=environment(workspace), capture_output=True, text=True)
    if log is not None:
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(f"$ dvc {' '.join(args)}\n{done.stdout}{done.stderr}")
    return done


def error_of(done: subprocess.CompletedProcess) -> str:
    """The one line that says why a dvc command failed: the stage's own one-line error, else the exception line
    of its traceback, else DVC's first error line."""
    lines = [line.strip() for line in done.stderr.splitlines() if line.strip()]
    for wanted in (lambda line: line.startswith("error: "),
                   lambda line: re.match(r"^[\w.]+(Error|Exception|Interrupt)\b", line),
                   lambda line: line.startswith("ERROR: ")):
        found = [line for line in lines if wanted(line)]
        if found:
            return found[-1] if not found[-1].startswith("ERROR: ") else found[0]
    return (lines or [f"exit status {done.returncode}"])[-1]


# ------------------------------------------------------------------------ running

def expected_steps(params: dict, key: str) -> int:
    """A run's stream steps (CoCa's counted four times: its passes), to start the longest runs first."""
    spec = resolve_run(params, key)
    counts = params["sources"][spec.data.source]["train_per_class"] or \
        SOURCE_SHAPES[spec.data.source.removeprefix("random-")].counts("train")
    steps = len(stream_batches(params, spec.run.benchmark, spec.run.batch, spec.benchmark.epochs, list(counts)))
    return steps * (4 if spec.run.algorithm == "coca" else 1)


LOCK_ATTEMPTS = 5   # a train stage refused DVC's repository lock (another run's stage held it) is started again


def train(workspace: Path, key: str, dry: dict, cuts: str) -> dict:
    """One run's train stage through DVC; its status, steps, seconds and what was cut of it."""
    start = time.perf_counter()
    for attempt in range(LOCK_ATTEMPTS):   # runs side by side share one repository, whose lock DVC waits on briefly
        done = dvc(workspace, "repro", "--single-item", f"train@{key}", log=workspace / "logs" / f"{key}.log")
        if done.returncode == 0 or "Unable to acquire lock" not in done.stdout + done.stderr:
            break
        time.sleep(1 + attempt)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        return {"key": key, "ok": False, "seconds": seconds, "error": error_of(done), "cuts": cuts}
    metrics = json.loads((workspace / run_dir(dry["runs"][key]) / "metrics.json").read_text())
    seed = next(iter(metrics["seeds"].values()))
    return {"key": key, "ok": True, "seconds": seconds, "steps": seed["steps"], "train_seconds": seed["train_seconds"],
            "cuts": cuts}


def line(result: dict) -> str:
    if result["ok"]:
        return (f"ok      {result['key']:<36} {result['steps']:>7} steps  {result['seconds']:7.1f} s "
                f"({result['train_seconds']:.1f} s training)  cut: {result['cuts']}")
    return f"FAILED  {result['key']:<36} {'':>13}  {result['seconds']:7.1f} s  {result['error']}  (cut: {result['cuts']})"


def run_cuts(params: dict, dry: dict, key: str) -> str:
    """What the dry run cut of run `key`, in words: what its line says it did not prove at the real size."""
    real, cut = resolve_run(params, key), resolve_run(dry, key)
    out = []
    if len(real.seeds) > len(cut.seeds):
        out.append(f"{len(cut.seeds)} of {len(real.seeds)} seeds")
    if cut.benchmark.epochs < real.benchmark.epochs:
        out.append(f"{cut.benchmark.epochs} of {real.benchmark.epochs} epochs")
    counts = dry["sources"][cut.data.source]["train_per_class"]
    if counts is not None:
        full = shape_of(params, real.data.source).counts("train")
        out.append(f"{sum(counts) / sum(full):.0%} of the images")
    if cut.benchmark.width is not None and real.benchmark.width is None:
        out.append(f"width {cut.benchmark.width}" + (f", input pooled to {cut.benchmark.input_size} px"
                                                     if cut.benchmark.input_size else ""))
    for name, value in NUMERICS.get(real.run.algorithm, {}).items():
        if getattr(cut.run, name) != getattr(real.run, name):
            out.append(f"{name} {getattr(cut.run, name):g} (real {getattr(real.run, name):g})")
    if real.run.algorithm == "cndpm":
        out.append(f"experts narrowed, {cut.run.sleep_steps_vae} sleep steps")
    return ", ".join(out) or "nothing"


NOT_PROVEN = """not proven by this dry run (docs/dryrun.md):
- accuracy: random pixels, not the real readers (no download, no decoding); narrowed networks; the tables mean nothing;
- {seeds}, trained in one process: the seed-worker pool (`workers`, spawn on a GPU) is not run here;
- {compiled};
- the cuts each run's line names: fewer images, epochs and seeds; oEWC's penalty weight and CN-DPM's experts cut;{intervals}
- speed and memory at full size (python -m gcl.bench grid), numerical health at full width on real data."""


def main(argv=None) -> int:
    args = parse_args(argv)
    if not (args.root / "dvc.yaml").is_file():
        raise SystemExit(f"error: {args.root.resolve()} holds no dvc.yaml: run from the project's root folder, or "
                         "name it with --root")
    args.root = args.root.resolve()
    params = load_params(args.profile)
    keys = selected_runs(params, args.runs, args.one_per_method)
    dry = dry_profile(params, keys, args)
    workspace = (args.workspace or args.root / ".dryrun" / args.profile.stem).resolve()
    with only_dry_run(workspace):
        return dry_run(args, params, keys, dry, workspace)


def dry_run(args: argparse.Namespace, params: dict, keys: list[str], dry: dict, workspace: Path) -> int:
    started = time.perf_counter()
    prepare_workspace(args.root, workspace, dry, args.fresh)
    print(f"dry run of {len(keys)} run(s) of {args.profile} in {workspace}, {args.jobs} at a time", flush=True)

    # the shared upstream stages first (checks, random sources, benchmarks), then the runs side by side
    upstream = dvc(workspace, "repro", *(f"benchmark@{b}" for b in dry["benchmarks"]), log=workspace / "logs" /
                   "upstream.log")
    if upstream.returncode != 0:
        print(f"FAILED  the checks, sources or benchmarks: {error_of(upstream)}")
        return 1
    checked = dvc(workspace, "repro", "check@runs", log=workspace / "logs" / "check-runs.log")
    if checked.returncode != 0:
        print(f"FAILED  check@runs: {error_of(checked)}")
        return 1
    print(f"        sources and benchmarks ready in {time.perf_counter() - started:.1f} s", flush=True)
    order = sorted(keys, key=lambda k: -expected_steps(dry, k))
    results = []
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        jobs = [pool.submit(train, workspace, k, dry, run_cuts(params, dry, k)) for k in order]
        for job in concurrent.futures.as_completed(jobs):
            results.append(job.result())
            print(line(results[-1]), flush=True)
    failed = [r for r in results if not r["ok"]]
    if not failed:
        report = dvc(workspace, "repro", log=workspace / "logs" / "report.log")
        if report.returncode != 0:
            print(f"FAILED  report: {error_of(report)}")
            return 1
        print(f"ok      report: {workspace / 'results' / 'tables.md'}")
    by_bench = {}
    for key in keys:
        by_bench[dry["runs"][key]["benchmark"]] = by_bench.get(dry["runs"][key]["benchmark"], 0) + 1
    print(f"{len(results) - len(failed)} of {len(results)} run(s) passed in {time.perf_counter() - started:.1f} s "
          f"({', '.join(f'{b}: {n}' for b, n in sorted(by_bench.items()))})")
    for r in failed:
        print(f"failed: {r['key']}: {r['error']}")
    compiled = ("eager on the CPU: compiled steps and CUDA graphs run only where a GPU compiles them (tools/gpucheck.sh)"
                if args.device == "cpu" else f"on {args.device} at the benchmarks' compile setting")
    seeds = ("one seed per run (so no stacked seeds: --seeds 2 trains them)" if args.seeds == 1 else
             f"at most {args.seeds} seeds per run, stacked where the run stacks")
    intervals = ("\n- the report's comparisons with one seed a side: their differences, not their Welch intervals;"
                 if args.seeds == 1 else "")
    print(NOT_PROVEN.format(compiled=compiled, seeds=seeds, intervals=intervals))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
