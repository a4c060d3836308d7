"""Process grid and traced collectives — the only package in tpsim that imports mpi4py.

What a collective costs (``tpsim.cost``) and the error type (``tpsim.errors``) live below this package, MPI-free.
MPI is loaded first, through ``tpsim.mpi_library``: without an MPI library, the error names what to install.
"""

from tpsim.mpi_library import load_mpi

load_mpi()  # before any module below imports mpi4py.MPI

from tpsim.comm.grid import ProcessGrid, format_cube, format_grid, grid_cube, grid_layout
from tpsim.comm.group import Group
from tpsim.comm.tracer import CommEvent, P2PEvent, SpanEvent, Tracer

__all__ = ["CommEvent", "P2PEvent", "SpanEvent", "Group", "ProcessGrid", "Tracer", "format_cube", "format_grid",
           "grid_cube", "grid_layout"]
