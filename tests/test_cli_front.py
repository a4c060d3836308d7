"""The ``tpsim`` command's front door: ``--version``, and a ``--help`` that names the programs run on ranks."""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata

import tpsim
from launch_program import ROOT
from tpsim import cli


def test_version_is_the_package_metadata_else_the_module_attribute(capsys, monkeypatch):
    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out == f"tpsim {metadata.version('tpsim')}\n"

    def not_installed(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", not_installed)
    assert cli.main(["-V"]) == 0 and capsys.readouterr().out == f"tpsim {tpsim.__version__}\n"


def test_help_names_every_command_and_the_programs_on_ranks_in_80_odd_columns(capsys):
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    for name in cli.COMMANDS:
        assert f"\n  {name} " in out
    assert "python -m tpsim.demo" in out and "python -m tpsim.generate" in out and "tpsim --version" in out
    assert max(map(len, out.splitlines())) <= 90, out
    assert cli.main([]) == 2  # no command: the same text, and a usage status


def test_version_from_a_shell():
    r = subprocess.run([sys.executable, "-m", "tpsim.cli", "--version"], capture_output=True, text=True, timeout=60,
                       cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": ""})
    assert r.returncode == 0 and r.stdout.startswith("tpsim ") and r.stdout.split()[1][0].isdigit(), r.stderr


def test_a_closed_pipe_ends_a_command_quietly():
    """`tpsim lesson list | head -1`: a reader that stops early. `true` reads nothing and is gone long before
    tpsim has imported itself, so every write meets a closed pipe: status 0 and no traceback all the same."""
    done = subprocess.run(f"{sys.executable} -m tpsim.cli lesson list | true; echo status ${{PIPESTATUS[0]}}",
                          shell=True, executable="/bin/bash", cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "status 0", done.stdout + done.stderr
    assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr, done.stderr
