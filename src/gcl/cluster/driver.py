"""The command: bring the shared stages up to date, restore the cells DVC's run cache holds, submit the others as
jobs (each in its own clone), watch them, and gather: `dvc repro` restores every cell from the run cache and writes
the report. Only this workspace writes its dvc.lock. One driver per workspace at a time; jobs outlive a driver, and
a later one waits for those still queued or running instead of submitting their cells again."""
from __future__ import annotations

import os
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from gcl.cluster import ClusterError, clones, workspace
from gcl.cluster.cleanup import refuse_live_commands, remove_idle_clones
from gcl.cluster.executors import JobOptions, Jobs, local_executor, sbatch_refusal, slot_gpus, slurm_executor
from gcl.cluster.job import CellJob, CellTask, dvc_command, end_groups
from gcl.cluster.records import DRIVER_LOCK, Scratch, Submission, SubmittedJob, read_attempts, write_attempts
from gcl.cluster.watch import FINAL, cell_views, summary_line
from gcl.cluster.workspace import Cell, Sharing
from gcl.core.processes import RunLock, RunLockedError

CANCEL_WAIT_S = 600.0               # how long a cancelled job may take to end


@dataclass
class Plan:
    """What the user asked for (gcl.cluster.cli)."""
    scratch: Path
    job: JobOptions
    share: str = "auto"                  # auto, remote or cache (gcl.cluster.workspace.sharing)
    cells_per_job: int = 1
    poll_s: float = 10.0
    detach: bool = False                 # submit, then leave the jobs to run (Slurm)


def drive(root: Path, plan: Plan, say: Callable[[str], None] = print) -> int:
    """Train the workspace's stale cells as jobs and gather them; 0 when the report is written, 1 when a cell
    failed (named above, with its log)."""
    with driver_lock(root):
        scratch = Scratch(plan.scratch.resolve())
        scratch.claim(root)
        share = workspace.sharing(root, plan.share)
        ran = workspace.run_shared_stages(root, share)
        say(f"shared stages: {'ran ' + ', '.join(ran) if ran else 'up to date'}; the jobs share results through "
            f"{'the DVC remote' if share.pull else 'the DVC cache ' + share.clone_settings['cache']['dir']}")
        restored, todo = workspace.restore_or_list(root, share)
        for cell in restored:
            say(f"in the run cache: train@{cell} (restored, not submitted)")
        jobs = Jobs(scratch.jobs)
        submission, attached = earlier_jobs(root, scratch, jobs, todo, say)
        remove_idle_clones(scratch, submission, jobs, restored, say)
        settings = clones.clone_settings(share.clone_settings, scratch.cache)
        for cell in sorted(attached):
            say(f"still queued or running from an earlier call: train@{cell} (job {submission.job_of()[cell]})")
        queue = [cell for cell in todo if cell.name not in attached]
        groups = [queue[i:i + plan.cells_per_job] for i in range(0, len(queue), plan.cells_per_job)]
        if groups:
            refuse_live_commands(scratch, queue)
            if share.pull:
                workspace.push_inputs(root, queue)
            clones.sync_clones(clones.workspace_state(root), [scratch.clone(c.name) for c in queue], settings)
        if not groups and not attached:
            say("every cell is in the run cache")
        else:
            submitter = Submitter(plan.job, scratch, share, submission, jobs, root)
            cells = {c.name for c in todo}
            if not watch(submitter, groups, cells, attached, plan, say):
                return 0                 # detached: the jobs run on
            if any(v.status == "failed" for v in cell_views(submission, jobs, scratch, cells)):
                done, _ = workspace.restore_or_list(root, share)      # the cells that are done, into this workspace
                remove_idle_clones(scratch, submission, jobs, done, say)
                say("the cells above failed; the others are restored here. Run the command again: it submits only "
                    "the cells still missing, each resuming from the progress files in its clone")
                return 1
        ran = workspace.gather(root, share)
        say(f"gathered: every cell restored from DVC's run cache; ran {', '.join(ran) if ran else 'nothing'}")
        remove_idle_clones(scratch, submission, jobs, [c.name for c in todo], say)
        return 0


def status(root: Path, say: Callable[[str], None] = print) -> int:
    """`--status`: the cells of the jobs submitted from this workspace, where they stand (no driver needed)."""
    submission = Submission.load(root)
    if submission is None:
        say("no jobs were submitted from this workspace (`python -m gcl.cluster` submits them)")
        return 0
    views = cell_views(submission, Jobs(Path(submission.folder)), Scratch(Path(submission.scratch)))
    for view in views:
        say(view.line())
    say(summary_line(views))
    return 0


class DriverStopped(KeyboardInterrupt):
    """Ctrl-C on the driver; `line` says what became of the jobs."""

    def __init__(self, line: str):
        super().__init__(line)
        self.line = line


@contextmanager
def driver_lock(root: Path):
    """One driver per workspace: a second one is refused in one line naming the first."""
    lock = RunLock(root / DRIVER_LOCK, "cluster")
    try:
        lock.__enter__()
    except RunLockedError:
        holder = (root / DRIVER_LOCK).read_text().strip() or "?"
        raise ClusterError(f"another `python -m gcl.cluster` drives this workspace (pid {holder}): wait for it to "
                           "end, or stop it (its jobs run on), then run again; `python -m gcl.cluster --status` "
                           "shows its jobs") from None
    try:
        yield
    finally:
        lock.__exit__()


def earlier_jobs(root: Path, scratch: Scratch, jobs: Jobs, todo: list[Cell], say: Callable[[str], None] = print,
                 deadline_s: float = CANCEL_WAIT_S) -> tuple[Submission, set[str]]:
    """The submission this call adds to (the earlier one, on the same scratch folder), and the cells to train whose
    latest job, submitted by an earlier driver, is still queued or running: this driver waits for it instead of
    submitting the cell again. A job that trains a cell whose settings changed since (its run-cache key) is
    cancelled, and waited for until it is over, so that its cells are submitted again into clones no job uses. Jobs
    still running from another scratch folder are refused (their cells would train twice, in two clones)."""
    earlier = Submission.load(root)
    if earlier is None:
        return Submission(str(scratch.root), str(scratch.jobs)), set()
    same = Path(earlier.scratch) == scratch.root
    latest = earlier.job_of()
    handles = jobs if same else Jobs(Path(earlier.folder))
    keys = {cell.name: cell.key for cell in todo}
    active = {cell for cell in set(keys) & set(latest)
              if handles.phase(earlier.jobs[latest[cell]].executor, latest[cell]).name != "over"}
    if not same:
        if active:
            raise ClusterError(f"jobs submitted with --scratch {earlier.scratch} still train {', '.join(sorted(active))}:"
                               f" run with that --scratch (it waits for them), or wait for them to end")
        return Submission(str(scratch.root), str(scratch.jobs)), set()
    obsolete = {latest[cell] for cell in active if earlier.jobs[latest[cell]].keys.get(cell, keys[cell]) != keys[cell]}
    for job_id in sorted(obsolete):
        handles.cancel(earlier.jobs[job_id].executor, job_id)
    end = time.monotonic() + deadline_s
    for job_id in sorted(obsolete):
        while handles.phase(earlier.jobs[job_id].executor, job_id, fresh=True).name != "over":
            if time.monotonic() > end:
                raise ClusterError(f"job {job_id}, cancelled (its cells' settings changed), has not ended after "
                                   f"{deadline_s:.0f} s: run again once it has (`python -m gcl.cluster --status`)")
            time.sleep(1.0)
        for cell in sorted(c for c in active if latest[c] == job_id):
            changed = "its settings changed" if earlier.jobs[job_id].keys.get(cell) != keys[cell] else \
                "its job's other cell's settings changed"
            say(f"cancelled train@{cell} (job {job_id}): {changed} since it was submitted; submitted again")
    return earlier, {cell for cell in active if latest[cell] not in obsolete}


class Submitter:
    """Submits groups of cells as jobs and writes each down (the submission record, in the workspace)."""

    def __init__(self, options: JobOptions, scratch: Scratch, share: Sharing, submission: Submission, jobs: Jobs,
                 root: Path):
        self.options, self.scratch, self.share, self.submission, self.jobs, self.root = \
            options, scratch, share, submission, jobs, root
        self.slots: dict[int, str] = {}        # local executor: slot -> the job using it (its GPUs)
        # local executor: each slot's CUDA_VISIBLE_DEVICES (None: the user's own), refused here if the GPUs are too few
        self.slot_gpus = slot_gpus(options, dict(os.environ)) if options.executor == "local" else []

    def task(self, cell: Cell, slot: int | None = None) -> CellTask:
        if self.share.pull:
            commands = (dvc_command("repro", "--pull", "--single-item", cell.stage),
                        dvc_command("push", "--run-cache", cell.stage))
        else:
            commands = (dvc_command("checkout", "--quiet", *cell.deps), dvc_command("repro", "--single-item", cell.stage))
        environment = {}            # Slurm sets CUDA_VISIBLE_DEVICES to the job's GPUs itself
        if slot is not None:        # submitit's local job hid or renumbered them: the slot's share, or the user's own
            gpus = self.slot_gpus[slot]
            environment["CUDA_VISIBLE_DEVICES"] = os.environ.get("CUDA_VISIBLE_DEVICES") if gpus is None else gpus
        return CellTask(cell.name, str(self.scratch.clone(cell.name)), commands, str(self.scratch.record(cell.name)),
                        str(self.scratch.log(cell.name)), environment, self.options.gpus)

    def submit_all(self, groups: list[list[Cell]]) -> None:
        """Slurm: every group at once, as one array throttled to --max-parallel. The jobs are written down as soon
        as sbatch took them, before submitit's own bookkeeping: a driver stopped then leaves none unrecorded (a
        later driver would submit their cells again, into the clones they train in)."""
        cell_jobs = [CellJob([self.task(c) for c in group]) for group in groups]
        written: list[str] = []

        def write_down(job_ids: list[str]) -> None:
            written.extend(job_ids)
            self._write_down(job_ids, groups)

        executor = slurm_executor(self.scratch.jobs, self.options, write_down)
        try:
            with executor.batch():
                submitted = [executor.submit(cell_job) for cell_job in cell_jobs]
        except KeyboardInterrupt:
            if written:
                raise DriverStopped(f"stopped while submitting: the {len(written)} jobs sbatch took run on, written down "
                                    "(`python -m gcl.cluster --status`); the same command run again waits for them and "
                                    "gathers") from None
            raise
        except Exception as exc:
            if written:                  # sbatch took the jobs: what failed after it is no refusal
                raise
            # sbatch's refusal (a partition that does not exist, ...), as submitit says it
            raise ClusterError(f"Slurm refused the jobs: {sbatch_refusal(exc)}") from None
        for job in submitted:
            self.jobs.add(job)

    def free_slots(self) -> list[int]:
        """Local executor: the slots (of --max-parallel) whose job is over."""
        slots = range(self.options.max_parallel or 1)
        return [s for s in slots if s not in self.slots or self.jobs.phase("local", self.slots[s]).name == "over"]

    def submit_local(self, group: list[Cell], slot: int) -> None:
        job = local_executor(self.scratch.jobs, self.options).submit(CellJob([self.task(c, slot) for c in group]))
        self.slots[slot] = self._record(job, group)

    def stop_local(self) -> list[str]:
        """Ctrl-C: stop the local jobs this driver started, and end their cells' commands (SIGINT to each process
        group, SIGKILL to what is left after the grace); an attempt no one ended is written down as stopped. Returns
        the cells stopped."""
        mine = {job_id: job for job_id, job in self.submission.jobs.items() if job_id in self.jobs.mine}
        for job_id in mine:
            self.jobs.handle(job_id).cancel()          # SIGINT to its controller, which stops the job's process
        running = []
        for job_id, job in mine.items():
            for cell in job.cells:
                attempts = read_attempts(self.scratch.record(cell))
                if attempts and attempts[-1].job == job_id and attempts[-1].outcome is None:
                    running.append((cell, attempts[-1].group))
        end_groups([group for _, group in running if group])
        for cell, _ in running:
            attempts = read_attempts(self.scratch.record(cell))
            if attempts[-1].outcome is None:           # its job was killed before it could say so
                attempts[-1].outcome, attempts[-1].detail = "stopped", "stopped with the driver (Ctrl-C)"
                attempts[-1].ended = attempts[-1].seen = time.time()
                write_attempts(self.scratch.record(cell), cell, attempts)
        return [cell for cell, _ in running]

    def _record(self, job, group: list[Cell]) -> str:
        job_id = self.jobs.add(job)
        self._write_down([job_id], [group])
        return job_id

    def _write_down(self, job_ids: list[str], groups: list[list[Cell]]) -> None:
        """Jobs just submitted, job_ids[i] training groups[i], into the submission record (one write for all)."""
        for job_id, group in zip(job_ids, groups, strict=True):
            self.submission.jobs[job_id] = SubmittedJob(self.options.executor, [c.name for c in group],
                                                        self.options.gpus, keys={c.name: c.key for c in group})
        self.submission.save(self.root)


def watch(submitter: Submitter, groups: list[list[Cell]], cells: set[str], attached: set[str], plan: Plan,
          say: Callable[[str], None]) -> bool:
    """Submit the groups (Slurm: at once; local: as slots free up), print a line per change and a summary, until
    every cell is done or failed. `attached`: cells whose earlier job this call waits for (said already, not
    "submitted" again). False when detached: the jobs were submitted and left to run."""
    local = plan.job.executor == "local"
    if local and plan.detach:
        raise ClusterError("--detach: local jobs run on this machine and need the driver to start them; use it "
                           "with --executor slurm")
    queue = list(groups)
    if not local and queue:
        submitter.submit_all(queue)
        queue = []
    seen: dict[str, tuple] = {cell: ("pending", 0) for cell in attached}
    try:
        return _watch(submitter, queue, cells, seen, plan, say)
    except KeyboardInterrupt:
        if not local:
            raise DriverStopped("stopped: Slurm jobs already submitted run on (`python -m gcl.cluster --status`); the "
                                "same command run again waits for them and gathers") from None
        stopped = submitter.stop_local()
        raise DriverStopped(f"stopped: the local jobs were stopped with their cells' commands ({len(stopped)} cells: "
                            f"{', '.join(stopped) or 'none running'}); their checkpoints stay in their clones, and the "
                            "same command run again resumes them") from None


def _watch(submitter: Submitter, queue: list[list[Cell]], cells: set[str], seen: dict[str, tuple], plan: Plan,
           say: Callable[[str], None]) -> bool:
    local = plan.job.executor == "local"
    while True:
        if local:
            for slot in submitter.free_slots():
                if queue:
                    submitter.submit_local(queue.pop(0), slot)
        views = cell_views(submitter.submission, submitter.jobs, submitter.scratch, cells)
        changes = [v for v in views if seen.get(v.cell) != (v.status, v.attempts)]
        for view in changes:
            seen[view.cell] = (view.status, view.attempts)
            say(view.line())
        if changes:
            say(summary_line(views))
        if plan.detach:
            say("detached: the jobs run on; `python -m gcl.cluster --status` shows them, and the same command run "
                "again waits for them and gathers")
            return False
        if not queue and all(v.status in FINAL for v in views):
            return True
        time.sleep(plan.poll_s)
