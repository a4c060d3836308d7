"""Process grid and traced collectives — the only package in tpsim that imports mpi4py.

What a collective costs (``tpsim.cost``) and the error type (``tpsim.errors``) live below this package, MPI-free.
"""

from tpsim.comm.grid import ProcessGrid, format_grid, grid_layout
from tpsim.comm.group import Group
from tpsim.comm.tracer import CommEvent, SpanEvent, Tracer

__all__ = ["CommEvent", "SpanEvent", "Group", "ProcessGrid", "Tracer", "format_grid", "grid_layout"]
