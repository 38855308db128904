"""Warm stage processes: a stage starts in a fraction of a second instead of the seconds that importing torch
takes.

`dvc repro` starts one Python process per stage, and importing torch and the library costs each of them
seconds, most of a short run's wall time (docs/performance.md). So dvc.yaml runs each stage script through a
launcher,

    cmd: python -m gcl.warm stages/train.py ${key} ${item}     # as `python stages/train.py ${key} ${item}`

which hands the script to a warm server (gcl.warm.server: a Python process that has imported what the stage
scripts import, torch and the library, once, and forks a child per stage). The child takes over the stage's standard
streams, working directory, environment, umask and arguments, runs the script exactly as `python <script>` would
(sys.argv, __file__, __name__ == "__main__", sys.path[0] the script's folder), and its exit status becomes the
stage's. When no server is available the launcher runs the script cold, in its own process, the same way
(gcl.warm.client, gcl.warm.stage). The stage scripts are plain scripts: `python stages/train.py <run>` runs one
cold, with Python's own traceback for any error.

What holds:
- The numbers cannot differ from a cold start: the server never runs a torch operation or any stage code
  itself, and it serves only stages whose interpreter, import path, import-time environment and library code
  (every byte of src/gcl) are the ones it was started with, and whose process context (CPU affinity, priority,
  resource limits, cgroup: what a fork inherits from the server, not from the stage) is the server's; anything
  else gets a server of its own, started on first use (gcl.warm.protocol.server_key).
- A server exits as soon as the processes its stages belong to (`dvc repro`, say) have all ended, or after
  GCL_WARM_KEEP_ALIVE (30) seconds without a stage, and removes only its own socket: nothing stays behind a
  finished `dvc repro`.
- A stage waits at most GCL_WARM_ACK_TIMEOUT (10) seconds for a server to take it, then runs cold; the child runs
  only on the stage's go-ahead, so a server that wakes up after its stage gave up runs nothing.
- If the stage process (the launcher DVC started) dies, its child ends too, and the child's worker processes
  with it; a child killed by a signal ends the stage by the same signal, and Ctrl-C reaches the child.
- Warm or cold, Ctrl-C (SIGINT) stops a stage even where it was started with SIGINT ignored (a shell starts a
  script's background commands so, `dvc repro &`): the launcher restores Python's own handling, where a cold
  `python <script>` would sit through it.
- Warm or cold, an error the user can fix ends the stage as one line (gcl.core.errors.error_line); any other
  shows the script's own traceback, without the launcher's frames above it.
- GCL_WARM=0 switches warm processes off: every stage runs cold. Any failure to reach a server runs the stage
  cold too, silently, as does a stage whose socket folder ($XDG_RUNTIME_DIR/gcl-warm-<uid>, else under /tmp)
  cannot be made or used.
"""
