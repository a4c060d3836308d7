"""A pip user can learn from the package: wheel and sdist built with ``python -m build``, installed into a fresh
venv, used from a folder outside the repository.

What a learner who never cloned the repository does, in order: ``pip install "tpsim[mpich]"`` (here: from the
wheel just built), ``tpsim --version``, ``tpsim lesson list``, ``tpsim lesson run 03``, ``tpsim lesson start 02``
then ``tpsim check 02`` (the stub: "not done yet"), the reference answer through ``tpsim check``, and the demo.
The sdist is installed too (pip builds a wheel from it): it must carry the lessons. The venv's PYTHONPATH is
cleared, so nothing of the checkout is imported. Needs PyPI (or a mirror) for the build backend and tpsim's
dependencies; pip's cache makes a rerun quick.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from launch_program import ROOT

pytestmark = pytest.mark.slow
NOT_DONE = 3
build = pytest.importorskip("build", reason="python -m build needs the 'build' package (the test extra has it)")


def run(cmd, *, cwd: Path, env: dict, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL, start_new_session=True)


def ok(result: subprocess.CompletedProcess, code: int = 0) -> str:
    assert result.returncode == code, f"exit {result.returncode} (expected {code}):\n{result.stdout}\n{result.stderr}"
    return result.stdout


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(the venv's bin folder, an environment using only it, the sdist) after the wheel's install."""
    tmp = tmp_path_factory.mktemp("package")
    dist = tmp / "dist"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    ok(run([sys.executable, "-m", "build", "--outdir", dist, ROOT], cwd=tmp, env=env, timeout=600))
    wheel, = dist.glob("tpsim-*.whl")
    sdist, = dist.glob("tpsim-*.tar.gz")
    venv.create(tmp / "venv", with_pip=True)
    bin_dir = tmp / "venv" / "bin"
    env = {**env, "PATH": f"{bin_dir}{os.pathsep}{env.get('PATH', '')}", "VIRTUAL_ENV": str(tmp / "venv")}
    ok(run([bin_dir / "python", "-m", "pip", "install", "--quiet", f"{wheel}[mpich]"], cwd=tmp, env=env,
           timeout=900))
    learner = tmp / "learner"
    learner.mkdir()
    return bin_dir, env, sdist, learner


def test_the_installed_package_is_not_the_checkout(installed):
    bin_dir, env, _, learner = installed
    where = ok(run([bin_dir / "python", "-c", "import tpsim; print(tpsim.__file__)"], cwd=learner, env=env))
    assert str(bin_dir.parent) in where and str(ROOT) not in where


def test_version_and_the_lesson_list(installed):
    bin_dir, env, _, learner = installed
    from tpsim import __version__
    assert ok(run([bin_dir / "tpsim", "--version"], cwd=learner, env=env)).strip() == f"tpsim {__version__}"
    listing = ok(run([bin_dir / "tpsim", "lesson", "list"], cwd=learner, env=env))
    for number in ("01", "03", "16"):
        assert f"tpsim lesson run {number}" in listing  # the lessons are not below this folder: the command
    assert "lessons/" not in listing                      # that finds them, not a path that is not there


def test_a_lesson_runs_from_the_package(installed):
    bin_dir, env, _, learner = installed
    out = ok(run([bin_dir / "tpsim", "lesson", "run", "03", "--out", learner / "out"], cwd=learner, env=env))
    assert "lesson 03:" in out and "all OK" in out


def test_the_lesson_that_reads_a_committed_study_runs_from_the_package(installed):
    """Lesson 15 reads figures/drift.json and its curves: installed as tpsim/lessons/figures/."""
    bin_dir, env, _, learner = installed
    out = ok(run([bin_dir / "tpsim", "lesson", "run", "15", "--out", learner / "out15"], cwd=learner, env=env))
    assert "lesson 15:" in out and "all OK" in out and (learner / "out15" / "15_drift.png").is_file()


def test_an_exercise_is_started_checked_and_solved_from_the_package(installed):
    bin_dir, env, _, learner = installed
    out = ok(run([bin_dir / "tpsim", "lesson", "start", "02"], cwd=learner, env=env))
    copy = learner / "tpsim-work" / "ex02_conjugate_f_g.py"
    assert copy.is_file() and f"to {copy.relative_to(learner)}" in out
    out = ok(run([bin_dir / "tpsim", "check", "02"], cwd=learner, env=env), NOT_DONE)
    assert "not done yet" in out
    where = ok(run([bin_dir / "tpsim", "lesson", "solution", "02"], cwd=learner, env=env))
    solution = Path(where.split(": ", 1)[1].strip())
    assert solution.is_file() and str(bin_dir.parent) in str(solution)
    copy.write_text(solution.read_text())
    out = ok(run([bin_dir / "tpsim", "check", "02"], cwd=learner, env=env))
    assert "exercise 02 OK" in out


def test_the_demo_runs_from_the_package(installed):
    bin_dir, env, _, learner = installed
    out = ok(run([bin_dir / "mpirun", "-n", "8", bin_dir / "python", "-m", "tpsim.demo", "--steps", "2",
                  "--out", learner / "demo"], cwd=learner, env=env))
    assert "every check holds" in out


def test_the_sdist_carries_the_lessons(installed):
    bin_dir, env, sdist, learner = installed
    ok(run([bin_dir / "python", "-m", "pip", "install", "--quiet", "--no-deps", "--force-reinstall", sdist],
           cwd=learner, env=env, timeout=600))
    listing = ok(run([bin_dir / "tpsim", "lesson", "list"], cwd=learner, env=env))
    commands = re.findall(r"tpsim lesson run \d\d\b", listing)
    assert len(commands) == len(list((ROOT / "lessons").glob("[0-9][0-9]_*.py")))
