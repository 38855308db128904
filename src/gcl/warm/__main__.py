"""The launcher dvc.yaml runs each stage with: `python -m gcl.warm <script> [args ...]` runs the script as
`python <script> [args ...]` would (sys.argv, __file__, __name__ == "__main__", sys.path[0] the script's folder,
the exit status), in a warm server's child when one is available, else cold in this process.

    python -m gcl.warm stages/train.py mnist-360-er-200        # warm, or cold where no server can be had
    GCL_WARM=0 python -m gcl.warm stages/train.py ...          # always cold: warm processes switched off

Either way an error the user can fix ends the stage as one line, the stage ends when its parent (`dvc repro`)
does, and Ctrl-C (SIGINT) stops it even where it was started with SIGINT ignored. The guarantees are gcl.warm's;
GCL_WARM_KEEP_ALIVE and GCL_WARM_ACK_TIMEOUT tune the server's idle time and a stage's wait for it
(gcl.warm.server, gcl.warm.client).
"""
import signal
import sys
from pathlib import Path

from gcl.core import layout
from gcl.core.processes import die_with_parent
from gcl.warm import stage
from gcl.warm.client import run_stage

USAGE = "usage: python -m gcl.warm <script.py> [args ...]   (runs it as `python <script.py> [args ...]`, warm if it can)"


def main(argv: list[str]) -> None:
    if not argv or argv[0].startswith("-"):
        sys.exit(USAGE)
    require_own_library(argv[0])
    die_with_parent()   # a killed `dvc repro` must not leave this stage (and so its warm child) running
    react_to_ctrl_c()
    status = run_stage(argv[0], argv[1:])
    if status is not None:
        sys.exit(status)
    stage.run(stage.prepare(argv[0], argv[1:]))    # cold: Python itself handles what the script raises


def require_own_library(script: str) -> None:
    """Stop (one line) a stage of one checkout that would run another checkout's library: with `pip install -e`
    pointing at one checkout, a second one (a git worktree at another commit, a cluster clone) imports the first's
    gcl unless PYTHONPATH says otherwise, and would train that code while DVC records its own. A copy with the same
    code (a DVC experiment's temporary copy of the workspace) runs: the two libraries' files are compared, not their
    paths."""
    project = Path(script).resolve().parents[1]
    own = project / "src" / "gcl"
    if not own.is_dir() or project == layout.PROJECT:
        return
    from gcl.core.fingerprint import library_digest, tree_digest
    if tree_digest(["."], own) != library_digest():
        sys.exit(f"error: {script} belongs to the project at {project}, but Python imports gcl from "
                 f"{layout.PROJECT / 'src'} (another checkout: the one `pip install -e` points at?), whose code differs "
                 f"from this project's; run with PYTHONPATH={project / 'src'}, or pip install -e {project}")


def react_to_ctrl_c() -> None:
    """Let Ctrl-C (SIGINT) stop the stage, warm or cold, however it was started: a shell starts the background
    commands of a script (`dvc repro &`, `nohup ... &`) with SIGINT ignored, and Python keeps it ignored, so such a
    stage would sit through every Ctrl-C and `kill -INT` sent to it. A stage stopped so resumes from its
    checkpoints (docs/running.md)."""
    signal.signal(signal.SIGINT, signal.default_int_handler)


if __name__ == "__main__":
    main(sys.argv[1:])
