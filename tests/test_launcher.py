"""tpsim.launcher: which MPI an ``mpiexec`` belongs to, and what each one needs to start a job on one machine.

The ``--version`` texts are fixed copies of what each launcher prints (MPICH 5.0.2's Hydra and Open MPI 5.0.11
as measured here; Open MPI 4's OpenRTE and Intel MPI 2021 as their launchers print them). A fake ``mpiexec``
(a shell script that writes down its arguments and environment) checks the command ``launch`` really runs.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys

import pytest

from launch_program import without_launcher_notices
from tpsim import launcher
from tpsim.launcher import INTEL_MPI, MPICH, OPEN_MPI, ROOT_ENV, UNKNOWN, mpi_kind, mpi_needs

HYDRA = """HYDRA build details:
    Version:                                 5.0.2
    Release Date:                            Fri Sep 25 20:45:26 UTC 2026
    Process Manager:                         pmi
    Launchers available:                     ssh rsh fork slurm ll lsf sge manual persist
"""
OPEN_MPI_5 = "mpiexec (Open MPI) 5.0.11\n\nReport bugs to https://www.open-mpi.org/community/help/\n"
OPEN_MPI_4 = "mpiexec (OpenRTE) 4.0.3\n\nReport bugs to http://www.open-mpi.org/community/help/\n"
INTEL = ("Intel(R) MPI Library for Linux* OS, Version 2021.10 Build 20230619 (id: c2e19c2f3e)\n"
         "Copyright 2003-2023, Intel Corporation.\nHYDRA build details:\n    Version: 4.1.1\n")


@pytest.mark.parametrize("text, kind", [(HYDRA, MPICH), (OPEN_MPI_5, OPEN_MPI), (OPEN_MPI_4, OPEN_MPI),
                                        (INTEL, INTEL_MPI), ("", UNKNOWN), ("mpiexec: unknown option\n", UNKNOWN)],
                         ids=["mpich-5", "open-mpi-5", "open-mpi-4", "intel-2021", "empty", "other"])
def test_mpi_kind_from_version_text(text, kind):
    assert mpi_kind(text) == kind


@pytest.mark.parametrize("kind", [MPICH, INTEL_MPI, UNKNOWN])
def test_mpich_and_intel_need_nothing_even_as_root(kind):
    assert mpi_needs(kind, root=True, environ={}) == launcher.MpiNeeds()


def test_open_mpi_gets_oversubscribe_and_as_root_the_two_variables_with_a_note():
    user = mpi_needs(OPEN_MPI, root=False, environ={})
    assert user.flags == ("--oversubscribe",) and user.env == {} and user.note == ""
    root = mpi_needs(OPEN_MPI, root=True, environ={})
    assert root.flags == ("--oversubscribe",) and root.env == ROOT_ENV
    assert root.note.count("\n") == 0 and "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1" in root.note
    already = mpi_needs(OPEN_MPI, root=True, environ=dict(ROOT_ENV))  # the user's own setting is left alone
    assert already.env == {} and already.note == ""


def fake_mpiexec(tmp_path, version: str):
    """A shell script standing in for mpiexec: prints ``version`` for --version, else its arguments and the
    environment entries a launch may set, one per line."""
    script = tmp_path / "mpiexec"
    script.write_text("#!/bin/sh\n"
                      f"if [ \"$1\" = --version ]; then printf '%s' '{version}'; exit 0; fi\n"
                      "for a in \"$@\"; do echo \"arg $a\"; done\n"
                      "echo \"env ROOT=$OMPI_ALLOW_RUN_AS_ROOT CONFIRM=$OMPI_ALLOW_RUN_AS_ROOT_CONFIRM\"\n"
                      "echo \"env MPLBACKEND=$MPLBACKEND UNBUFFERED=$PYTHONUNBUFFERED\"\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(script)


def test_detect_mpi_runs_version_once_per_path(tmp_path):
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    assert launcher.detect_mpi(fake_mpiexec(tmp_path / "a", OPEN_MPI_5)) == OPEN_MPI
    assert launcher.detect_mpi(fake_mpiexec(tmp_path / "b", HYDRA)) == MPICH
    assert launcher.detect_mpi(str(tmp_path / "no-such-mpiexec")) == UNKNOWN


def test_the_mpiexec_used_here_is_recognised():
    assert launcher.detect_mpi(launcher.mpiexec()) in (MPICH, OPEN_MPI, INTEL_MPI)


@pytest.mark.parametrize("version, root", [(OPEN_MPI_5, True), (OPEN_MPI_5, False), (HYDRA, True)],
                         ids=["open-mpi-as-root", "open-mpi-as-user", "mpich-as-root"])
def test_launch_runs_what_the_mpi_needs(tmp_path, monkeypatch, capsys, version, root):
    monkeypatch.setattr(launcher, "mpiexec", lambda: fake_mpiexec(tmp_path, version))
    monkeypatch.setattr(launcher, "_is_root", lambda: root)
    monkeypatch.setenv("PYTHONUNBUFFERED", "1")
    for name in ROOT_ENV:
        monkeypatch.delenv(name, raising=False)
    launcher._say_once.cache_clear()
    run = launcher.launch(3, ["-m", "x", "--y"], timeout=30, mpiexec_flags=("-hosts", "a,b"))
    assert run.returncode == 0, run.stderr
    args = [line[4:] for line in run.stdout.splitlines() if line.startswith("arg ")]
    open_mpi = version is OPEN_MPI_5
    assert args == [*(["--oversubscribe"] if open_mpi else []), "-hosts", "a,b", "-n", "3", sys.executable,
                    "-m", "x", "--y"]
    as_root = open_mpi and root
    assert f"env ROOT={'1' if as_root else ''} CONFIRM={'1' if as_root else ''}" in run.stdout
    assert "env MPLBACKEND=" in run.stdout and "UNBUFFERED=\n" in run.stdout + "\n"
    assert ("OMPI_ALLOW_RUN_AS_ROOT=1" in capsys.readouterr().err) is as_root  # the one-line note, said once


def test_mpiexec_prefix_for_ipyparallel_puts_the_root_pair_in_this_process(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(launcher, "mpiexec", lambda: fake_mpiexec(tmp_path, OPEN_MPI_5))
    monkeypatch.setattr(launcher, "_is_root", lambda: True)
    monkeypatch.setattr(os, "environ", {k: v for k, v in os.environ.items() if k not in ROOT_ENV})
    assert launcher.mpiexec_prefix() == [str(tmp_path / "mpiexec"), "--oversubscribe"]
    assert all(os.environ[k] == "1" for k in ROOT_ENV)  # the engines' mpiexec inherits them


def test_python_m_tpsim_launcher_shows_and_checks_its_arguments(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(launcher, "mpiexec", lambda: fake_mpiexec(tmp_path, OPEN_MPI_5))
    monkeypatch.setattr(launcher, "_is_root", lambda: False)
    assert launcher.main(["--show", "-n", "8", "-m", "tpsim.demo", "--tp", "4"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"# Open MPI: {tmp_path / 'mpiexec'}"
    assert out[1].endswith(f"mpiexec --oversubscribe -n 8 {sys.executable} -m tpsim.demo --tp 4")
    for bad in ([], ["-n"], ["-n", "x", "a.py"], ["-n", "2"], ["--bogus", "-n", "2", "a.py"]):
        assert launcher.main(bad) == 2 and "usage:" in capsys.readouterr().err
    assert launcher.main(["-n", "2", "-c", "pass"]) == 0  # runs the fake: it prints and exits 0


def test_launcher_and_hosts_import_without_mpi():
    code = "import sys, tpsim.launcher, tpsim.hosts; assert 'mpi4py' not in sys.modules, 'mpi4py was imported'"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert done.returncode == 0, done.stderr


def test_open_mpis_boxed_notice_is_told_apart_from_the_programs_line():
    dashes = "-" * 74
    stderr = (f"tpsim.demo: error: world size 4 is not divisible by --tp 3\n[warn] Epoll MOD(4) on fd 24 failed. "
              f"Old events were 6: Bad file descriptor\n{dashes}\nprterun detected that one or "
              f"more processes exited with non-zero status,\n\n   Exit code:    2\n{dashes}\n")
    assert without_launcher_notices(stderr) == "tpsim.demo: error: world size 4 is not divisible by --tp 3\n"
    assert without_launcher_notices("tpsim.demo: error: x\n") == "tpsim.demo: error: x\n"
