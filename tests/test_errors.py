"""Errors a user or the machine causes are one line naming the problem and the fix; others keep their traceback."""
import errno
import os

import pytest

from gcl.errors import UserError, file_system_error
from gcl.warm import run_main


def raising(exc):
    def main():
        raise exc
    return main


@pytest.mark.parametrize("code, fix", [
    (errno.EACCES, "make it writable"), (errno.EROFS, "read-only"), (errno.ENOSPC, "free disk space"),
    (errno.EISDIR, "a folder stands where a file belongs"),
])
def test_a_file_system_error_with_a_known_fix_is_one_line_naming_the_path(code, fix):
    with pytest.raises(SystemExit) as stop:
        run_main(raising(OSError(code, os.strerror(code), "runs/m/er/200/.tmp1", None, "runs/m/er/200/metrics.json")))
    line = str(stop.value.code)
    assert line.startswith("error: cannot use runs/m/er/200/metrics.json: ") and fix in line and "\n" not in line


def test_other_errors_keep_their_traceback():
    with pytest.raises(ConnectionResetError):                 # an OSError without a fix of ours
        run_main(raising(ConnectionResetError(errno.ECONNRESET, "reset")))
    with pytest.raises(OSError):                              # a known errno without a path to name
        run_main(raising(OSError(errno.EACCES, "denied")))
    assert file_system_error(OSError(errno.EACCES, "denied")) is None
    with pytest.raises(SystemExit, match="^error: bad setting$"):
        run_main(raising(UserError("bad setting")))


def test_a_real_folder_where_a_file_belongs(tmp_path):
    from gcl.atomic import write_json
    (tmp_path / "metrics.json").mkdir()
    with pytest.raises(SystemExit) as stop:
        run_main(lambda: write_json(tmp_path / "metrics.json", {"a": 1}))
    assert str(stop.value.code) == (f"error: cannot use {tmp_path / 'metrics.json'}: Is a directory. Fix: a folder "
                                    "stands where a file belongs: remove it and run again")
