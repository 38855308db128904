"""The commands a user runs beside the pipeline are modules of the package: `python -m gcl.bench <command>` dispatches
to each benchmark's own parser, and gcl.tune, gcl.dryrun and gcl.snapshot answer --help with their usage."""
import subprocess
import sys

import pytest

from gcl import dryrun, snapshot, tune
from gcl.bench import __main__ as bench


def test_python_m_gcl_bench_lists_its_commands():
    done = subprocess.run([sys.executable, "-m", "gcl.bench", "--help"], capture_output=True, text=True)
    assert done.returncode == 0
    assert all(name in done.stdout for name in bench.COMMANDS)
    assert subprocess.run([sys.executable, "-m", "gcl.bench"], capture_output=True, text=True).returncode == 2


def test_each_command_reaches_its_modules_parser(capsys):
    for name, module in bench.COMMANDS.items():
        with pytest.raises(SystemExit) as exit_:
            bench.main([name, "--help"])
        assert exit_.value.code == 0
        assert f"usage: python -m gcl.bench {name}" in capsys.readouterr().out, module
    with pytest.raises(SystemExit, match="no command 'speed'; the commands: steps, grid"):
        bench.main(["speed"])


@pytest.mark.parametrize("module", [tune, dryrun, snapshot])
def test_the_package_commands_say_how_they_are_run(module, capsys):
    with pytest.raises(SystemExit) as exit_:
        module.main(["--help"])
    assert exit_.value.code == 0
    assert f"usage: python -m {module.__name__}" in capsys.readouterr().out
