"""submitit's executors as this command uses them, and where a submitted job stands. submitit talks to Slurm (sbatch,
sacct, scontrol); nothing here does. A job's phase is read afresh from its id, so that `--status` and a later driver
see jobs an earlier driver submitted."""
from __future__ import annotations

import os
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import submitit
from submitit.local.local import LocalJob
from submitit.slurm.slurm import SlurmJob

from gcl.cluster import ClusterError

LOCAL_TIME_MIN = 7 * 24 * 60            # the local executor's time-out: none to speak of

# Every job state Slurm names (squeue's long names and sacct's, 22.05 to 24.x), and where it leaves the job:
# "waiting" (to start, or to start again: no process of it runs), "running" (its processes may be at work in the
# cell's clone: started, ending, suspended, stopped, signalled) or "over" (it ended; no process of it is left once
# squeue no longer lists it). A state not in the table counts as running: never over by mistake.
SLURM_PHASES = {
    "PENDING": "waiting", "REQUEUED": "waiting", "REQUEUE_HOLD": "waiting", "REQUEUE_FED": "waiting",
    "RESV_DEL_HOLD": "waiting", "SPECIAL_EXIT": "waiting", "CONFIGURING": "waiting",
    "UNKNOWN": "waiting",            # submitit's word for a job sacct does not list yet
    "RUNNING": "running", "COMPLETING": "running", "SIGNALING": "running", "STAGE_OUT": "running",
    "SUSPENDED": "running", "STOPPED": "running", "RESIZING": "running",
    "COMPLETED": "over", "FAILED": "over", "CANCELLED": "over", "TIMEOUT": "over", "NODE_FAIL": "over",
    "PREEMPTED": "over", "BOOT_FAIL": "over", "DEADLINE": "over", "OUT_OF_MEMORY": "over", "REVOKED": "over",
}


def slurm_phase(state: str) -> str:
    """The phase of a job Slurm says is in `state` ("CANCELLED by 1000" and "CANCELLED+" read as CANCELLED)."""
    return SLURM_PHASES.get(state.split()[0].rstrip("+").upper() if state.strip() else "UNKNOWN", "running")


def sbatch_memory(mem_gb: float) -> str:
    """--mem-gb as sbatch takes it: whole megabytes (sbatch refuses a fraction: --mem=32.0GB)."""
    return f"{max(1, round(mem_gb * 1024))}M"


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
                        ("cpus_per_task", options.cpus), ("mem", options.mem_gb and sbatch_memory(options.mem_gb))):
        if value is not None:
            parameters[name] = value
    executor.update_parameters(**parameters)
    return executor


def local_executor(folder: Path, options: JobOptions) -> submitit.LocalExecutor:
    """One local job's executor. The GPUs its cells see are theirs to set (CellTask.environment): submitit's own
    CUDA_VISIBLE_DEVICES for a local job counts GPUs from 0, whatever the user sees, and hides them all at 0."""
    executor = submitit.LocalExecutor(folder=folder, max_num_timeout=options.max_timeouts)
    time_min = options.time_min if options.time_min != JobOptions.time_min else LOCAL_TIME_MIN
    executor.update_parameters(timeout_min=time_min, stderr_to_stdout=True, setup=list(options.setup))
    return executor


def visible_gpus(environ: dict[str, str]) -> tuple[list[str], str]:
    """The GPUs a user sees, and where that was read: CUDA_VISIBLE_DEVICES's entries (indices or UUIDs) where it is
    set, else each GPU `nvidia-smi -L` lists (none without it)."""
    if "CUDA_VISIBLE_DEVICES" in environ:
        value = environ["CUDA_VISIBLE_DEVICES"]
        return [g.strip() for g in value.split(",") if g.strip()], f"CUDA_VISIBLE_DEVICES={value!r}"
    try:
        listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return [], "no nvidia-smi, no CUDA_VISIBLE_DEVICES"
    gpus = [line for line in listed.stdout.splitlines() if line.startswith("GPU ")] if listed.returncode == 0 else []
    return [str(i) for i in range(len(gpus))], "nvidia-smi -L"


def slot_gpus(options: JobOptions, environ: dict[str, str]) -> list[str | None]:
    """Local executor: the CUDA_VISIBLE_DEVICES of each of the --max-parallel slots: the GPUs the user sees, dealt
    out --gpus to a slot (slot i the i-th share); None at --gpus 0, where a job keeps what the user has (it never
    hides the GPUs: a GPU machine would train every cell on the CPU)."""
    slots = options.max_parallel or 1
    if not options.gpus:
        return [None] * slots
    gpus, source = visible_gpus(environ)
    if len(gpus) < slots * options.gpus:
        raise ClusterError(f"--executor local --gpus {options.gpus} --max-parallel {slots} needs {slots * options.gpus} "
                           f"GPUs, and {len(gpus)} are visible ({source}). Fix: lower --max-parallel or --gpus")
    return [",".join(gpus[i * options.gpus:(i + 1) * options.gpus]) for i in range(slots)]


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
        self._gone: dict[str, Phase] = {}     # Slurm jobs over and forgotten by squeue: they stay so

    @property
    def mine(self) -> set[str]:
        """The jobs this process submitted."""
        return set(self._mine)

    def handle(self, job_id: str) -> SlurmJob | LocalJob:
        return self._handles[job_id]

    def add(self, job: SlurmJob | LocalJob) -> str:
        """A job this process submitted; returns its id."""
        self._handles[job.job_id] = job
        self._mine.add(job.job_id)
        return job.job_id

    def phase(self, executor: str, job_id: str, fresh: bool = False) -> Phase:
        """Where the job stands; `fresh`: Slurm asked now (submitit's watcher asks sacct at most once a minute)."""
        if job_id not in self._handles:
            self._handles[job_id] = (SlurmJob if executor == "slurm" else LocalJob)(folder=self.folder, job_id=job_id)
        job = self._handles[job_id]
        if isinstance(job, SlurmJob):
            if job_id in self._gone:
                return self._gone[job_id]
            said = job.watcher.get_state(job_id, mode="force") if fresh else job.state
            state, name = (said.split() or ["UNKNOWN"])[0].upper(), slurm_phase(said)    # "CANCELLED by 0": CANCELLED
            if name == "over":     # sacct's word: its processes may still be ending (squeue: COMPLETING)
                queued = self.squeue_state(job_id)
                if queued is None:
                    self._gone[job_id] = Phase("over", state, job.paths.stdout)      # final: Slurm forgot the job
                    return self._gone[job_id]
                name, state = slurm_phase(queued), queued
            return Phase(name, state, job.paths.stdout)
        if job_id in self._mine:       # a local job this process started: its controller is our child
            running = not job.done()
        else:       # by an earlier driver: its controller (whose pid is the job id) is alive, or not
            running = _alive(int(job_id)) and not job.paths.result_pickle.exists()
        return Phase("running" if running else "over", "RUNNING" if running else "FINISHED", job.paths.stdout)

    def cancel(self, executor: str, job_id: str) -> None:
        """Cancel a job through submitit (scancel; a local job's controller gets SIGINT, as submitit stops it)."""
        self.phase(executor, job_id)                  # a handle on it
        job = self._handles[job_id]
        if isinstance(job, SlurmJob) or job_id in self._mine:
            job.cancel(check=False)
        elif _alive(int(job_id)):                     # an earlier driver's local job: its controller, by its pid
            os.kill(int(job_id), signal.SIGINT)

    @staticmethod
    def squeue_state(job_id: str) -> str | None:
        """The job's state as squeue says it (COMPLETING while its processes end), or None once squeue no longer
        lists it (or cannot be asked: sacct's word stands)."""
        try:
            done = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True,
                                  timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            return None
        states = done.stdout.split()
        return states[0].upper() if done.returncode == 0 and states else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    cmdline = Path(f"/proc/{pid}/cmdline")
    return not cmdline.exists() or b"submitit" in cmdline.read_bytes()     # a reused pid is not our controller
