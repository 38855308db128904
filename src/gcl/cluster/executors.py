"""submitit's executors as this command uses them, and where a submitted job stands. submitit talks to Slurm (sbatch,
sacct, scontrol); here only squeue is asked (where sacct cannot tell), and sacct once, whether Slurm keeps accounting.
A job's phase is read afresh from its id, so that `--status` and a later driver see jobs an earlier driver
submitted."""
from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import submitit
from submitit.core.utils import JobPaths
from submitit.local.local import LocalJob
from submitit.slurm.slurm import SlurmJob

from gcl.cluster import ClusterError

SLURM_TIME_MIN = 24 * 60                # a Slurm job's time limit without --time
LOCAL_TIME_MIN = 7 * 24 * 60            # a local job's time-out without --time: none to speak of
QUEUE_MAX_AGE_S = 5.0                   # how long one squeue answer serves (the driver polls every 10 s)
NOT_LISTED = "UNKNOWN (in neither squeue nor sacct)"     # the state of a job Slurm has forgotten, without accounting

# Every job state Slurm names (squeue's long names and sacct's, 22.05 to 24.x), and where it leaves the job:
# "waiting" (to start, or to start again: no process of it runs), "running" (its processes may be at work in the
# cell's clone: started, ending, suspended, stopped, signalled) or "over" (it ended; no process of it is left once
# squeue no longer lists it). A state not in the table counts as running: never over by mistake.
SLURM_PHASES = {
    "PENDING": "waiting", "REQUEUED": "waiting", "REQUEUE_HOLD": "waiting", "REQUEUE_FED": "waiting",
    "RESV_DEL_HOLD": "waiting", "SPECIAL_EXIT": "waiting", "CONFIGURING": "waiting",
    "UNKNOWN": "waiting",            # submitit's word for a job sacct does not list (Jobs.phase then asks squeue)
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
    time_min: int | None = None              # as given (--time); None: SLURM_TIME_MIN, or LOCAL_TIME_MIN locally
    gpus: int = 0
    cpus: int | None = None
    mem_gb: float | None = None
    max_parallel: int | None = None          # jobs running at once (Slurm: the array's throttle)
    sbatch: dict[str, str] = field(default_factory=dict)      # any other sbatch option, passed as is
    setup: list[str] = field(default_factory=list)            # shell lines a job runs first (module load, ...)
    max_timeouts: int = 3                    # requeues after reaching the time limit (preemptions do not count)


class RecordingSlurmExecutor(submitit.SlurmExecutor):
    """submitit's Slurm executor, which also tells `submitted` the ids of the jobs each sbatch call submitted, as
    soon as sbatch returns (an array: each of its jobs, in the order they were submitted in the batch) and before
    submitit's own bookkeeping: an interruption after that loses no job already submitted."""

    def __init__(self, folder: Path, max_num_timeout: int, submitted: Callable[[list[str]], None] | None = None):
        super().__init__(folder=folder, max_num_timeout=max_num_timeout)
        self.submitted = submitted or (lambda job_ids: None)

    def _submit_command(self, command: str) -> SlurmJob:
        job = super()._submit_command(command)      # one job: sbatch; its pickle is put in place after this
        self.submitted([job.job_id])
        return job

    def _internal_process_submissions(self, delayed_submissions: list) -> list[SlurmJob]:
        """submitit's own (1.5), but with the array's jobs told as soon as sbatch returns (submitit names them only
        once each one's pickle is in place; its array submission goes through another executor, not this one)."""
        if len(delayed_submissions) == 1:
            return super()._internal_process_submissions(delayed_submissions)       # through _submit_command
        folder = JobPaths.get_first_id_independent_folder(self.folder)
        folder.mkdir(parents=True, exist_ok=True)
        pickles = [folder / f"{uuid.uuid4().hex}.pkl" for _ in delayed_submissions]
        for delayed, pickle in zip(delayed_submissions, pickles):
            delayed.set_timeout(self.parameters.get("time", 5), self.max_num_timeout)
            delayed.dump(pickle)
        array = submitit.SlurmExecutor(self.folder, self.max_num_timeout)
        array.update_parameters(**self.parameters)
        array.parameters["map_count"] = len(delayed_submissions)
        self._throttle()
        first = array._submit_command(self._submitit_command_str)
        job_ids = [f"{first.job_id}_{index}" for index in range(len(delayed_submissions))]
        self.submitted(job_ids)
        jobs = [SlurmJob(folder=self.folder, job_id=job_id, tasks=list(range(first.num_tasks))) for job_id in job_ids]
        for job, pickle in zip(jobs, pickles):
            job.paths.move_temporary_file(pickle, "submitted_pickle")
        return jobs


def slurm_executor(folder: Path, options: JobOptions,
                   submitted: Callable[[list[str]], None] | None = None) -> RecordingSlurmExecutor:
    """The executor of the jobs `options` describe; `submitted` is told each job's id once sbatch took it."""
    try:
        executor = RecordingSlurmExecutor(folder, options.max_timeouts, submitted)
    except RuntimeError as exc:          # no srun on the PATH
        raise ClusterError(f"--executor slurm: {exc} Fix: run the command on a Slurm login node, or use "
                           "--executor local") from None
    time_min = SLURM_TIME_MIN if options.time_min is None else options.time_min
    parameters = {"job_name": "gcl-cells", "time": time_min, "stderr_to_stdout": True,
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
    time_min = LOCAL_TIME_MIN if options.time_min is None else options.time_min      # --time as given
    executor.update_parameters(timeout_min=time_min, stderr_to_stdout=True, setup=list(options.setup))
    return executor


def sbatch_refusal(exc: Exception) -> str:
    """Why a submission failed, in one line: the last line submitit's error says (sbatch's stderr, as a rule), or,
    where it says nothing (sbatch failed silently), sbatch's exit status and what it printed, if anything."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if lines:
        return lines[-1]
    cause = exc.__cause__          # submitit raises its error from sbatch's CalledProcessError
    if not isinstance(cause, subprocess.CalledProcessError):
        return f"sbatch failed with no message ({type(exc).__name__})"
    printed = [line.strip() for line in str(cause.output or "").splitlines() if line.strip()]
    said = f"; it printed: {printed[-1]}" if printed else ""
    return f"sbatch failed with no message (exit code {cause.returncode}{said})"


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
    watcher that asks sacct about all of them in one call, and a new handle would make it ask again. squeue, where
    sacct's word is not enough, is asked once for all of the user's jobs, and its answer serves QUEUE_MAX_AGE_S."""

    def __init__(self, folder: Path):
        self.folder = folder
        self._handles: dict[str, SlurmJob | LocalJob] = {}
        self._mine: set[str] = set()
        self._gone: dict[str, Phase] = {}     # Slurm jobs over and forgotten by squeue: they stay so
        self._queue: dict[str, str] | None = None       # squeue's last answer (job id -> state); None: not asked
        self._queue_at = float("-inf")
        self._last_queued: dict[str, str] = {}         # the state squeue last said of each job
        self._accounting: bool | None = None           # whether sacct can be asked (None: not known yet)

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
        self._queue_at = float("-inf")        # squeue's last answer predates it: it would read as gone
        return job.job_id

    def phase(self, executor: str, job_id: str, fresh: bool = False) -> Phase:
        """Where the job stands; `fresh`: Slurm asked now (submitit's watcher asks sacct at most once a minute)."""
        if job_id not in self._handles:
            self._handles[job_id] = (SlurmJob if executor == "slurm" else LocalJob)(folder=self.folder, job_id=job_id)
        job = self._handles[job_id]
        if isinstance(job, SlurmJob):
            return self._slurm_phase(job, fresh)
        if job_id in self._mine:       # a local job this process started: its controller is our child
            running = not job.done()
        else:       # by an earlier driver: its controller (whose pid is the job id) is alive, or not
            running = _alive(int(job_id)) and not job.paths.result_pickle.exists()
        return Phase("running" if running else "over", "RUNNING" if running else "FINISHED", job.paths.stdout)

    def _slurm_phase(self, job: SlurmJob, fresh: bool) -> Phase:
        """sacct's word (through submitit), and squeue's where sacct calls the job over (its processes may still
        be ending: COMPLETING) or does not list it (UNKNOWN: no accounting, slurmdbd, or not yet): a job squeue
        lists is where its state says; one that neither lists has ended, and stays so."""
        if job.job_id in self._gone:
            return self._gone[job.job_id]
        said = self._sacct_state(job, fresh)
        state, name = (said.split() or ["UNKNOWN"])[0].upper(), slurm_phase(said)    # "CANCELLED by 0": CANCELLED
        if name != "over" and state != "UNKNOWN":
            return Phase(name, state, job.paths.stdout)
        queue = self.queue(fresh)
        if queue is None:              # squeue cannot be asked: sacct's word stands (UNKNOWN waits, never over)
            return Phase(name, state, job.paths.stdout)
        if job.job_id not in queue:    # final: Slurm forgot the job (how it ended: sacct's word, or squeue's last)
            ended = state if name == "over" else self._last_queued.get(job.job_id, "")
            self._gone[job.job_id] = Phase("over", ended if slurm_phase(ended) == "over" else NOT_LISTED,
                                           job.paths.stdout)
            return self._gone[job.job_id]
        self._last_queued[job.job_id] = queue[job.job_id]
        return Phase(slurm_phase(queue[job.job_id]), queue[job.job_id], job.paths.stdout)

    def _sacct_state(self, job: SlurmJob, fresh: bool) -> str:
        """sacct's word on the job, through submitit's watcher; UNKNOWN, without asking, where Slurm keeps no
        accounting (sacct would fail, and say so on the driver's output, at every look)."""
        if self._accounting is None:
            self._accounting = keeps_accounting()
        if not self._accounting:
            return "UNKNOWN"
        return job.watcher.get_state(job.job_id, mode="force") if fresh else job.state

    def queue(self, fresh: bool = False) -> dict[str, str] | None:
        """squeue's answer, at most QUEUE_MAX_AGE_S old (`fresh`: asked now): this user's jobs Slurm still holds,
        each array job by itself ("4117_3"), with its state; None when squeue cannot be asked."""
        if fresh or self._queue is None or time.monotonic() - self._queue_at > QUEUE_MAX_AGE_S:
            self._queue, self._queue_at = squeue_states(), time.monotonic()
        return self._queue

    def cancel(self, executor: str, job_id: str) -> None:
        """Cancel a job through submitit (scancel; a local job's controller gets SIGINT, as submitit stops it)."""
        self.phase(executor, job_id)                  # a handle on it
        job = self._handles[job_id]
        if isinstance(job, SlurmJob) or job_id in self._mine:
            job.cancel(check=False)
        elif _alive(int(job_id)):                     # an earlier driver's local job: its controller, by its pid
            os.kill(int(job_id), signal.SIGINT)


def keeps_accounting() -> bool:
    """Whether Slurm keeps accounting (slurmdbd), where sacct, and submitit through it, reads job states: False only
    where sacct says it is disabled (a sacct that fails otherwise, or is missing, is left to submitit, which goes on)."""
    try:
        done = subprocess.run(["sacct", "-n", "-X", "-j", "1", "-o", "JobID"], capture_output=True, text=True,
                              timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return True
    return "accounting storage is disabled" not in done.stderr.lower()


def squeue_states() -> dict[str, str] | None:
    """The state of each job of this user's that Slurm still holds, as squeue says it (COMPLETING while its
    processes end; an ended job for a while, MinJobAge), by job id, an array's jobs one by one; None when squeue
    cannot be asked (no squeue, no controller): a job missing from the answer is over, so a failure is not an
    empty answer."""
    # -a: jobs in hidden partitions too (a job left out would read as over); -r: an array's pending jobs one by one
    command = ["squeue", "-h", "-a", "-r", "-t", "all", "-u", str(os.geteuid()), "-o", "%i %T"]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    states = {}
    for line in done.stdout.splitlines():
        fields = line.split()
        if len(fields) == 2:
            states[fields[0]] = fields[1].upper()
    return states


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    cmdline = Path(f"/proc/{pid}/cmdline")
    return not cmdline.exists() or b"submitit" in cmdline.read_bytes()     # a reused pid is not our controller
