"""Process grid and traced collectives — the only package in tpsim that imports mpi4py."""

from tpsim.comm.cost import wire_bytes
from tpsim.comm.grid import ConfigError, ProcessGrid, format_grid, grid_layout
from tpsim.comm.group import Group
from tpsim.comm.tracer import CommEvent, SpanEvent, Tracer

__all__ = ["CommEvent", "SpanEvent", "ConfigError", "Group", "ProcessGrid", "Tracer", "format_grid", "grid_layout", "wire_bytes"]
