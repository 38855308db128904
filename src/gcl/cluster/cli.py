"""The command's options: `python -m gcl.cluster --help` (docs/running.md, "Many machines")."""
from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

from gcl.cluster import ClusterError
from gcl.cluster.cleanup import clean
from gcl.cluster.driver import Plan, drive, status
from gcl.cluster.executors import LOCAL_TIME_MIN, SLURM_TIME_MIN, JobOptions
from gcl.core.errors import error_line

EXAMPLES = """examples:
  python -m gcl.cluster --scratch /shared/$USER/coca-scratch --gpus 1 --cpus 8 --time 720 --max-parallel 16
  python -m gcl.cluster --scratch /tmp/$USER-coca-scratch --executor local --max-parallel 2
  python -m gcl.cluster --clean
  python -m gcl.cluster --status
"""


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m gcl.cluster", epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Train the train@ cells a `dvc repro` would run as jobs (Slurm, or local processes), each in a "
                    "clone of its own, then gather them through DVC's run cache and write the report.")
    p.add_argument("--status", action="store_true", help="where the cells of the jobs submitted earlier stand")
    p.add_argument("--clean", action="store_true", help="remove the clones no job uses (and, when no job runs, the "
                   "DVC cache they share) from the scratch folder, then exit")
    p.add_argument("--scratch", type=Path, help="a folder the jobs reach (shared storage, for Slurm), yours alone (made "
                   "0700): one clone per cell, their records and logs, submitit's files")
    p.add_argument("--executor", choices=("slurm", "local"), default="slurm")
    p.add_argument("--max-parallel", type=int, help="jobs running at once (Slurm: the array's throttle; local: "
                   "default 2)")
    p.add_argument("--cells-per-job", type=int, default=1, help="cells that share one job (and its GPUs), side by side")
    p.add_argument("--share", choices=("auto", "remote", "cache"), default="auto", help="how jobs hand results "
                   "back: the default DVC remote, or this workspace's DVC cache folder (auto: the remote if set)")
    p.add_argument("--partition", help="Slurm partition")
    p.add_argument("--time", type=int, metavar="MINUTES", help="time limit per job, as given; a job that reaches it is "
                   f"requeued and resumes (default: {SLURM_TIME_MIN} on Slurm; locally {LOCAL_TIME_MIN}, none to speak of)")
    p.add_argument("--gpus", type=int, default=0, help="GPUs per job (default 0)")
    p.add_argument("--cpus", type=int, help="CPUs per job")
    p.add_argument("--mem-gb", type=float, help="memory per job, GB (sbatch gets it in whole megabytes)")
    p.add_argument("--sbatch", action="append", default=[], metavar="OPTION=VALUE",
                   help="any other sbatch option, e.g. --sbatch account=myproj --sbatch qos=high (repeatable)")
    p.add_argument("--setup", action="append", default=[], metavar="SHELL_LINE",
                   help="a line each job runs first, e.g. 'module load cuda' (repeatable)")
    p.add_argument("--max-timeouts", type=int, default=3, help="requeues of a job that reached its time limit")
    p.add_argument("--poll", type=float, default=10.0, metavar="SECONDS", help="how often the driver looks")
    p.add_argument("--detach", action="store_true", help="submit, then leave the jobs running (Slurm); run the same "
                   "command again to wait for them and gather")
    return p


def plan_of(args: argparse.Namespace) -> Plan:
    if args.scratch is None:
        raise ClusterError("--scratch: name a folder the jobs reach (for Slurm, on shared storage)")
    for name, least in (("max_parallel", 1), ("cells_per_job", 1), ("time", 1), ("cpus", 1), ("gpus", 0),
                        ("max_timeouts", 0), ("mem_gb", 0.001), ("poll", 0.001)):
        value = getattr(args, name)
        if value is not None and value < least:
            raise ClusterError(f"--{name.replace('_', '-')} {value}: must be at least {least}" if least >= 1 else
                               f"--{name.replace('_', '-')} {value}: must be {'positive' if least else 'zero or more'}")
    sbatch = {}
    for option in args.sbatch:
        key, equals, value = option.partition("=")
        if not equals or not key:
            raise ClusterError(f"--sbatch {option}: write it as OPTION=VALUE, e.g. --sbatch account=myproj")
        sbatch[key.lstrip("-")] = value
    max_parallel = args.max_parallel or (2 if args.executor == "local" else None)
    job = JobOptions(args.executor, args.partition, args.time, args.gpus, args.cpus, args.mem_gb, max_parallel, sbatch,
                     args.setup, args.max_timeouts)
    return Plan(args.scratch, job, args.share, args.cells_per_job, args.poll, args.detach)


def main(argv: list[str] | None = None) -> int:
    # Ctrl-C (or `kill -INT`) stops the driver, and its local jobs with it, even where it was started with SIGINT
    # ignored (a script's background command): Python would keep it ignored, and the driver would not stop
    signal.signal(signal.SIGINT, signal.default_int_handler)
    args = parser().parse_args(argv)
    root = Path.cwd()
    try:
        if not (root / "dvc.yaml").exists():
            raise ClusterError(f"{root} has no dvc.yaml: run the command in the workspace")
        if args.status:
            return status(root)
        if args.clean:
            return clean(root, args.scratch, say=_say)
        return drive(root, plan_of(args), say=_say)
    except KeyboardInterrupt as stopped:       # the driver's own line (DriverStopped), or Ctrl-C before any job
        print(getattr(stopped, "line", "stopped before any job was submitted"), file=sys.stderr)
        return 130
    except Exception as exc:
        line = error_line(exc)
        if line is None:
            raise
        print(f"error: {line}", file=sys.stderr)
        return 1


def _say(line: str) -> None:
    print(line, flush=True)
