"""Errors a user can cause and fix: bad settings, missing or damaged data, a device the machine lacks, a run
that another process is training. A stage prints such an error as one line naming the problem and the fix,
without a traceback (gcl.warm.run_warm); any other exception is a bug and keeps its traceback."""


class UserError(Exception):
    """The message says what is wrong and what to do; nothing in the traceback would help the user."""
