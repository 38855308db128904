"""How a stage script runs, cold in the launcher's own process or warm in a server's child: as `python <script>
<args>` runs it, with errors the user can fix as one line."""
from __future__ import annotations

import builtins
import os
import signal
import sys
import types
from importlib.machinery import SourceFileLoader

_script = None    # the running script's path: tracebacks start at its frames


def prepare(script: str, args: list[str]) -> str:
    """Set this process up as `python <script> <args>` sets it up (sys.argv, sys.path[0] the script's real folder)
    and install the stage's error hook; the script's absolute path, its __file__, to `run` next."""
    global _script
    _script = os.path.abspath(script)
    sys.argv = [script, *args]
    sys.path[0] = os.path.dirname(os.path.realpath(_script))
    sys.excepthook = excepthook
    return _script


def run(path: str) -> None:
    """Run the script at `path` as the __main__ module, its exceptions (SystemExit included) left to the caller."""
    try:
        with open(path, "rb") as f:
            source = f.read()
    except OSError as exc:
        print(f"{sys.executable}: can't open file {path!r}: [Errno {exc.errno}] {exc.strerror}", file=sys.stderr)
        sys.exit(2)
    main = types.ModuleType("__main__")
    main.__dict__.update(__file__=path, __cached__=None, __builtins__=builtins,
                         __loader__=SourceFileLoader("__main__", path))
    sys.modules["__main__"] = main
    exec(compile(source, path, "exec"), main.__dict__)


def excepthook(kind, exc, tb) -> None:
    """An error the user can fix as one line (gcl.core.errors.error_line); any other with its traceback from the
    script's own frames on, as a cold `python <script>` prints it (none of the launcher's or the server's)."""
    from gcl.core.errors import error_line
    line = error_line(exc)
    if line is not None:
        print(f"error: {line}", file=sys.stderr)
        return
    own = tb
    while own is not None and own.tb_frame.f_code.co_filename != _script:
        own = own.tb_next
    if own is not None or (isinstance(exc, SyntaxError) and exc.filename == _script):
        tb = own     # Python shows a script's syntax error with no traceback above it
    # set on the exception itself: the interpreter's hook prints the exception's own traceback, not its argument
    sys.__excepthook__(kind, exc.with_traceback(tb), tb)


def die_by(signum: int) -> None:
    """End this process by signal `signum`, its default action restored (SIGKILL's cannot be changed)."""
    if signum not in (signal.SIGKILL, signal.SIGSTOP):
        signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
