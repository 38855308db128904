"""submitit's executors as this command uses them, and where a submitted job stands. submitit talks to Slurm (sbatch,
sacct, scontrol); nothing here does. A job's phase is read afresh from its id, so that `--status` and a later driver
see jobs an earlier driver submitted."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import submitit
from submitit.local.local import LocalJob
from submitit.slurm.slurm import SlurmJob

from gcl.cluster import ClusterError

LOCAL_TIME_MIN = 7 * 24 * 60            # the local executor's time-out: none to speak of
# Slurm's job states that are neither running nor over (a requeued job is PENDING again, or REQUEUED for a moment)
WAITING = {"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "CONFIGURING", "RESIZING", "PREEMPTED", "SUSPENDED"}


@dataclass
class JobOptions:
    """What each job asks for (the command's options; docs/running.md)."""
    executor: str = "slurm"
    partition: str | None = None
    time_min: int = 24 * 60
    gpus: int = 0
    cpus: int | None = None
    mem_gb: float | None = None
    max_parallel: int | None = None          # jobs running at once (Slurm: the array's throttle)
    sbatch: dict[str, str] = field(default_factory=dict)      # any other sbatch option, passed as is
    setup: list[str] = field(default_factory=list)            # shell lines a job runs first (module load, ...)
    max_timeouts: int = 3                    # requeues after reaching the time limit (preemptions do not count)


def slurm_executor(folder: Path, options: JobOptions) -> submitit.SlurmExecutor:
    try:
        executor = submitit.SlurmExecutor(folder=folder, max_num_timeout=options.max_timeouts)
    except RuntimeError as exc:          # no srun on the PATH
        raise ClusterError(f"--executor slurm: {exc} Fix: run the command on a Slurm login node, or use "
                           "--executor local") from None
    parameters = {"job_name": "gcl-cells", "time": options.time_min, "stderr_to_stdout": True,
                  "additional_parameters": dict(options.sbatch), "setup": list(options.setup)}
    if options.max_parallel:
        parameters["array_parallelism"] = options.max_parallel
    for name, value in (("partition", options.partition), ("gpus_per_node", options.gpus or None),
                        ("cpus_per_task", options.cpus), ("mem", options.mem_gb and f"{options.mem_gb}GB")):
        if value is not None:
            parameters[name] = value
    executor.update_parameters(**parameters)
    return executor


def local_executor(folder: Path, options: JobOptions, gpus: tuple[int, ...] = ()) -> submitit.LocalExecutor:
    """One local job's executor; `gpus`: the GPUs it may see (CUDA_VISIBLE_DEVICES)."""
    executor = submitit.LocalExecutor(folder=folder, max_num_timeout=options.max_timeouts)
    time_min = options.time_min if options.time_min != JobOptions.time_min else LOCAL_TIME_MIN
    executor.update_parameters(timeout_min=time_min, gpus_per_node=len(gpus), visible_gpus=gpus,
                               stderr_to_stdout=True, setup=list(options.setup))
    return executor


@dataclass(frozen=True)
class Phase:
    """Where a job stands: "waiting" (to start, or to start again), "running" or "over"; `state` as the scheduler
    says it (COMPLETED, FAILED, CANCELLED, TIMEOUT, ...), `log` its own log (submitit's)."""
    name: str
    state: str
    log: Path


class Jobs:
    """Handles on submitted jobs, one per job id for the life of this process: submitit's Slurm jobs share one
    watcher that asks sacct about all of them in one call, and a new handle would make it ask again."""

    def __init__(self, folder: Path):
        self.folder = folder
        self._handles: dict[str, SlurmJob | LocalJob] = {}
        self._mine: set[str] = set()

    def add(self, job: SlurmJob | LocalJob) -> str:
        """A job this process submitted; returns its id."""
        self._handles[job.job_id] = job
        self._mine.add(job.job_id)
        return job.job_id

    def phase(self, executor: str, job_id: str) -> Phase:
        if job_id not in self._handles:
            self._handles[job_id] = (SlurmJob if executor == "slurm" else LocalJob)(folder=self.folder, job_id=job_id)
        job = self._handles[job_id]
        if isinstance(job, SlurmJob):
            state = job.state.split()[0].upper()        # "CANCELLED by 0" -> CANCELLED
            name = "over" if job.done() else "waiting" if state in WAITING | {"UNKNOWN"} else "running"
            return Phase(name, state, job.paths.stdout)
        if job_id in self._mine:       # a local job this process started: its controller is our child
            running = not job.done()
        else:       # by an earlier driver: its controller (whose pid is the job id) is alive, or not
            running = _alive(int(job_id)) and not job.paths.result_pickle.exists()
        return Phase("running" if running else "over", "RUNNING" if running else "FINISHED", job.paths.stdout)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    cmdline = Path(f"/proc/{pid}/cmdline")
    return not cmdline.exists() or b"submitit" in cmdline.read_bytes()     # a reused pid is not our controller
