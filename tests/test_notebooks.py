"""Lessons as notebooks: the percent-format reader, the notebook ``tpsim lesson notebook`` writes, and two of
them executed headlessly (nbclient, an ipykernel kernel) on ipyparallel MPI engines — lesson 02 on 2 ranks,
lesson 03 on 4 — with their CHECK lines, summary line and inline figure found in the cell outputs.

Reading and writing need nothing beyond tpsim; executing needs the ``notebooks`` extra
(``pip install -e ".[notebooks]"``) and is skipped, with that reason, without it.
"""

from __future__ import annotations

import json
import sys
import time

import pytest

from tpsim.cli import main as tpsim_main
from tpsim.teach.cells import parse_cells
from tpsim.teach.lessons import discover, find_lesson, read_checks
from tpsim.teach.notebook import PX, lesson_notebook, write_notebook

PERCENT = """\
# %% [markdown]
# # Lesson 99 — A title
#
# Prose, with a blank line above.

# %%
RANKS = 2
x = 1

# %% a titled code cell
y = x + 1
# %% [markdown]
# More prose.
"""


def test_percent_cells_are_read_with_their_kind_text_and_line():
    cells = parse_cells(PERCENT)
    assert [c.kind for c in cells] == ["markdown", "code", "code", "markdown"]
    assert cells[0].source == "# Lesson 99 — A title\n\nProse, with a blank line above."
    assert cells[1].source == "RANKS = 2\nx = 1" and cells[1].line == 7
    assert cells[2].source == "y = x + 1" and cells[2].line == 11
    assert cells[3].source == "More prose."


def test_code_before_the_first_marker_is_a_cell_and_empty_cells_are_dropped():
    cells = parse_cells("import os\n\n# %%\n\n# %% [markdown]\n#\n# %%\nz = 3\n")
    assert [(c.kind, c.source, c.line) for c in cells] == [("code", "import os", 1), ("code", "z = 3", 8)]


@pytest.mark.parametrize("info", discover(), ids=lambda info: info.path.stem)
def test_every_lesson_becomes_a_notebook_of_px_cells_between_a_setup_and_a_stop(info):
    nb = lesson_notebook(info)
    code = ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]
    setup, lesson, stop = code[0], code[1:-1], code[-1]
    assert f'Cluster(engines="mpi", n={info.ranks}' in setup and "rc.activate()" in setup
    assert "mpiexec_prefix()" in setup  # the mpiexec beside this Python and its MPI's flags, as tpsim lesson run
    assert lesson and all(source.startswith(PX) for source in lesson)
    assert any(f"RANKS = {info.ranks}" in source for source in lesson)
    assert "stop_cluster_sync()" in stop
    assert nb["cells"][0]["cell_type"] == "markdown" and info.title in "".join(nb["cells"][0]["source"])
    prose = sum(c["cell_type"] == "markdown" for c in nb["cells"])
    assert prose == sum(line.startswith("# %% [markdown]") for line in info.path.read_text().splitlines()) + 1


def test_tpsim_lesson_notebook_writes_valid_ipynb_files(tmp_path, capsys):
    assert tpsim_main(["lesson", "notebook", "02", "3", "--out", str(tmp_path)]) == 0
    written = sorted(p.name for p in tmp_path.glob("*.ipynb"))
    assert written == [find_lesson("02").path.stem + ".ipynb", find_lesson("03").path.stem + ".ipynb"]
    assert "(lesson 03, 4 ranks)" in capsys.readouterr().out
    nbformat = pytest.importorskip("nbformat", reason="nbformat (the notebooks extra) validates the JSON")
    for path in tmp_path.glob("*.ipynb"):
        nbformat.validate(nbformat.read(path, as_version=4))


# --- executing them -----------------------------------------------------------------------------------------------
def _kernel_here(tmp_path, monkeypatch) -> str:
    """A kernelspec for this very Python (so the engines see this tpsim), found first through JUPYTER_PATH."""
    from ipykernel.kernelspec import write_kernel_spec

    write_kernel_spec(tmp_path / "jupyter" / "kernels" / "tpsim-test")
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    return "tpsim-test"


@pytest.fixture
def ipython_dir(tmp_path, monkeypatch):
    """An IPYTHONDIR of the test's own, where the clusters it starts keep their records. Afterwards, a backstop:
    the controller and mpiexec run in their own sessions, so a kernel that died without its atexit clean-up
    would leave them running; every cluster still recorded here is stopped."""
    for module in ("ipyparallel", "ipykernel", "nbclient", "nbformat"):
        pytest.importorskip(module, reason=f"{module} missing: pip install -e '.[notebooks]' runs the notebooks")
    import ipyparallel as ipp

    folder = tmp_path / "ipython"
    monkeypatch.setenv("IPYTHONDIR", str(folder))
    yield folder
    for record in (folder / "profile_default" / "security").glob("cluster-*.json"):
        ipp.Cluster.from_file(str(record)).stop_cluster_sync()


def execute(path, tmp_path, monkeypatch, timeout: float = 120) -> tuple[dict, float]:
    """Run the notebook at ``path`` headlessly (an ipykernel kernel of this Python, cwd ``tmp_path``)."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=timeout, kernel_name=_kernel_here(tmp_path, monkeypatch),
                            resources={"metadata": {"path": str(tmp_path)}})
    t0 = time.perf_counter()
    client.execute()
    return nb, time.perf_counter() - t0


def _leftover_cluster(number: str) -> list:
    """Engines and controller under the lesson's cluster name, as a kernel restarted while a cell hung leaves
    them; returns their processes."""
    import ipyparallel as ipp

    cluster = ipp.Cluster(engines="mpi", n=1, cluster_id=f"tpsim-lesson-{number}", log_level=40)
    cluster.start_cluster_sync()
    return [cluster.controller.process] + [engines.process for engines in cluster.engines.values()]


def _ended(process) -> bool:
    """A ``psutil.Process`` that exited (a zombie counts: this test process started it and has not reaped it)."""
    import psutil

    try:
        return process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _texts(cell) -> str:
    parts = []
    for output in cell.get("outputs", []):
        text = output.get("text") or output.get("data", {}).get("text/plain", "")
        parts.append("".join(text) if isinstance(text, list) else text)
    return "\n".join(parts)


@pytest.mark.slow
@pytest.mark.parametrize("number", ["02", "03"])
def test_generated_notebook_runs_on_mpi_engines_with_every_check_ok(number, tmp_path, monkeypatch, ipython_dir):
    info = find_lesson(number)
    left_behind = _leftover_cluster(number) if number == "02" else []
    nb, seconds = execute(write_notebook(info, tmp_path), tmp_path, monkeypatch)
    assert all(map(_ended, left_behind)), "the setup cell stops what a dead kernel left behind"
    print(f"lesson {number} as a notebook on {info.ranks} engines: {seconds:.1f} s", file=sys.stderr)

    text = "\n".join(_texts(cell) for cell in nb.cells)
    assert f"{info.ranks} MPI engines ready: ranks {list(range(info.ranks))}" in text
    checks = read_checks("\n".join(line.removeprefix("[stdout:0] ") for line in text.splitlines()))
    assert checks and [claim for claim, ok in checks if not ok] == [], text
    assert f"lesson {number}: {len(checks)} checks, all OK" in text
    assert "engines stopped" in text
    assert "[stdout:1]" not in text and "Out[" not in text, "rank 0's output only, and no cell value per rank"
    images = [o for cell in nb.cells for o in cell.get("outputs", []) if "image/png" in o.get("data", {})]
    if "lesson.save(" in info.path.read_text():
        assert images, "a lesson that saves a figure shows it inline"
    assert seconds < 90, f"lesson {number} took {seconds:.0f} s as a notebook"
    json.dumps(nb)  # the executed notebook is still plain JSON

