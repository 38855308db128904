"""Errors a user or the machine causes are one line naming the problem and the fix; others keep their traceback."""
import errno
import os

import pytest

from gcl.core.errors import UserError, error_line, file_system_error


@pytest.mark.parametrize("code, fix", [
    (errno.EACCES, "make it writable"), (errno.EROFS, "read-only"), (errno.ENOSPC, "free disk space"),
    (errno.EISDIR, "a folder stands where a file belongs"),
])
def test_a_file_system_error_with_a_known_fix_is_one_line_naming_the_path(code, fix):
    line = error_line(OSError(code, os.strerror(code), "runs/m/er/200/.tmp1", None, "runs/m/er/200/metrics.json"))
    assert line.startswith("cannot use runs/m/er/200/metrics.json: ") and fix in line and "\n" not in line


def test_other_errors_keep_their_traceback():
    assert error_line(ConnectionResetError(errno.ECONNRESET, "reset")) is None   # an OSError without a fix of ours
    assert error_line(OSError(errno.EACCES, "denied")) is None                   # a known errno, but no path to name
    assert file_system_error(OSError(errno.EACCES, "denied")) is None
    assert error_line(ValueError("a bug")) is None
    assert error_line(UserError("bad setting")) == "bad setting"


def test_a_real_folder_where_a_file_belongs(tmp_path):
    from gcl.core.atomic import write_json
    (tmp_path / "metrics.json").mkdir()
    with pytest.raises(OSError) as failed:
        write_json(tmp_path / "metrics.json", {"a": 1})
    assert error_line(failed.value) == (f"cannot use {tmp_path / 'metrics.json'}: Is a directory. Fix: a folder "
                                        "stands where a file belongs: remove it and run again")
