"""A profile's cells as cluster jobs: `python -m gcl.cluster` trains the train@ cells a `dvc repro` would run as
submitit jobs, on Slurm or as local processes, each in a clone of its own, and gathers them through DVC's run cache
(docs/running.md, "Many machines"). Outside the train stages' code (gcl.core.layout.TRAIN_CODE): editing it re-runs
no train stage.

    driver     the command: shared stages, the cells to train, clones, submission, watching, the gather
    cli        its options
    workspace  the user's workspace through DVC: shared stages, restores from the run cache, the gather
    clones     one clone per cell on the scratch folder, brought to the workspace as it is
    cleanup    the clones no job uses removed (after the gather, `--clean`); a cell whose commands still run refused
    job        what runs inside a job: its cells' DVC commands, stopped and requeued on preemption or time-out
    records    what jobs and the driver write down: each cell's attempts, the submission, the scratch layout
    executors  submitit's Slurm and local executors, and where a submitted job stands
    watch      the driver's lines: one per change, a summary, a failure with its log
"""
from gcl.core.errors import UserError


class ClusterError(UserError, RuntimeError):
    """Something the user can fix before or while the cells are submitted (the message says what)."""
