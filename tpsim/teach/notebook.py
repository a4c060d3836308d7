"""``tpsim lesson notebook NN``: a lesson as a Jupyter notebook whose cells run on the lesson's rank count.

A Jupyter kernel is one process, and the lessons need 2, 4 or 8 ranks. The field's standard bridge is
ipyparallel's MPI engines: ``mpiexec -n RANKS`` starts RANKS engines, each one an MPI rank with an IPython
kernel inside, and the ``%%px`` cell magic sends a cell to all of them and shows what they print and display.
So the notebook is the lesson's own cells with three changes:

1. after the title, an added cell starts ``ipyparallel.Cluster(engines="mpi", n=RANKS)`` with the ``mpiexec``
   beside this Python and what its MPI needs (``tpsim.launcher.mpiexec_prefix``, as ``tpsim lesson run``),
   connects, and activates ``%%px``;
2. every code cell of the lesson starts with ``%%px``; prose cells stay markdown;
3. a last added cell stops the engines.

Inside an engine the lesson's ``Lesson`` sees an IPython kernel (``in_kernel``) and switches to notebook mode
(tpsim.teach.runtime): rank 0 still does the printing, a figure saved with ``lesson.save`` is also displayed
inline (``show_inline``), a failed CHECK makes ``finish`` raise instead of ``sys.exit``, and no excepthook
aborts the engines. One warning the scripts do not need: if a cell fails on one rank while the others wait in
a collective, the cell hangs (ranks blocked inside MPI do not see an interrupt): restart the kernel and run the
cells again; the setup cell stops the engines the old kernel left behind (the cluster is named after the lesson).

Writing the notebook needs no Jupyter package (tpsim.teach.cells writes the JSON); running it needs the
``notebooks`` extra: ``pip install -e ".[notebooks]"`` (ipyparallel, ipykernel; nbclient runs it headlessly).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tpsim.atomic import write_text
from tpsim.teach.cells import as_notebook_cells, code_cell, markdown_cell, notebook, read_cells
from tpsim.teach.lessons import LessonInfo

DEFAULT_NOTEBOOKS = "tpsim-out/notebooks"
PX = "%%px\n"

SETUP = '''\
# Added by `tpsim lesson notebook`: start {ranks} MPI rank(s) as ipyparallel engines and send every cell below
# to all of them with %%px. Rank 0 prints and draws, so the outputs you see are rank 0's ([stdout:0]).
import os

for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(var, "1")  # one BLAS thread per rank; the engines inherit this environment
import ipyparallel as ipp

from tpsim.launcher import mpiexec_prefix

# A fixed name, so that this cell finds and stops engines that a kernel left behind when it was restarted while
# a cell hung (a rank blocked inside MPI ignores the interrupt, so they outlive the kernel).
cluster_id = "tpsim-lesson-{number}"
try:
    ipp.Cluster.from_file(cluster_id=cluster_id).stop_cluster_sync()
except FileNotFoundError:  # nothing left behind: the usual case
    pass
cluster = ipp.Cluster(engines="mpi", n={ranks}, cluster_id=cluster_id, log_level=30,  # warnings only
                      controller_args=["--ping=500"])  # a faster heartbeat: engines register in ~1 s, not ~5 s
cluster.config.MPIEngineSetLauncher.mpi_cmd = mpiexec_prefix()  # as `tpsim lesson run`: Open MPI gets its flags
cluster.start_cluster_sync()
rc = cluster.connect_client_sync()
rc.wait_for_engines({ranks}, interactive=False, timeout=120)
view = rc.activate()  # %%px now runs a cell on every engine (engine i is MPI rank i) and waits for all of them
view.execute('get_ipython().ast_node_interactivity = "none"')  # as in the script, a cell shows what it prints,
# not its last value once per rank; and %%px waits for every output (figures too) before the cell ends, with a
# progress bar only after 10 minutes (-1, "never", would also skip that wait and could lose a figure)
get_ipython().run_line_magic("pxconfig", "--progress-after 600")
print(f"{{len(rc.ids)}} MPI engines ready: ranks {{rc.ids}}")
'''

STOP = '''\
# Added by `tpsim lesson notebook`: stop the engines and their mpiexec (the setup cell starts them again).
rc.shutdown(block=True)
cluster.log.setLevel("ERROR")  # mpiexec reports engines that were told to stop as failed; that is expected
cluster.stop_cluster_sync()
print("engines stopped")
'''

NOTE = ("*This notebook was written by `tpsim lesson notebook {number}` from `lessons/{script}`; edit the lesson, "
        "not this file. Its code cells run on {ranks} MPI ranks (ipyparallel engines, `%%px`); it needs "
        "`pip install -e \".[notebooks]\"`.*")


def lesson_notebook(info: LessonInfo) -> dict:
    """The notebook JSON of one lesson: its cells (code as ``%%px``), the added setup and stop cells."""
    cells = read_cells(info.path)
    body = as_notebook_cells(cells, code_prefix=PX)
    head = 1 if cells and cells[0].kind == "markdown" else 0  # the title stays on top
    added = [markdown_cell(NOTE.format(number=info.number, script=info.path.name, ranks=info.ranks)),
             code_cell(SETUP.format(ranks=info.ranks, number=info.number))]
    return notebook(body[:head] + added + body[head:] + [code_cell(STOP)], f"Lesson {info.number} — {info.title}")


def write_notebook(info: LessonInfo, out: str | Path = DEFAULT_NOTEBOOKS) -> Path:
    """``out/NN_name.ipynb``; returns its path."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{info.path.stem}.ipynb"
    write_text(path, json.dumps(lesson_notebook(info), indent=1, ensure_ascii=False) + "\n")
    return path


def plain_notebook(info: LessonInfo) -> dict:
    """The lesson's cells as they are, without engines (what the book fills with a run's outputs)."""
    return notebook(as_notebook_cells(read_cells(info.path)), f"Lesson {info.number} — {info.title}")


# --- notebook mode, seen from inside a lesson ---------------------------------------------------------------------
def in_kernel() -> bool:
    """True inside an IPython kernel (a Jupyter kernel or an ipyparallel engine), False under plain mpirun.

    Looks only at modules already imported: a script run by ``python`` never imports IPython for this."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    return getattr(shell, "kernel", None) is not None


def show_inline(path: str | Path) -> None:
    """Display the PNG at ``path`` as a cell output (inside a kernel; ``%%px`` forwards it from the engine)."""
    from IPython.display import Image, display

    display(Image(filename=str(path)))
