"""The process grid: which ranks form each tensor-parallel (TP) and data-parallel (DP) group.

Megatron's rank order puts TP ranks next to each other (TP inside a node, over the fast links; DP between
nodes: §3.1 of the SenseParrots article, and Narayanan et al. 2021), so the whole grid is one reshape of the
world ranks:

    grid = arange(world).reshape(dp, tp)        # row i = TP group i,  column j = DP group j
    world 8, tp 4  ->  TP [[0,1,2,3],[4,5,6,7]]            DP [[0,4],[1,5],[2,6],[3,7]]
    world 8, tp 2  ->  TP [[0,1],[2,3],[4,5],[6,7]]        DP [[0,2,4,6],[1,3,5,7]]

and each rank's coordinates fall out of it: ``tp_rank = rank % tp``, ``dp_rank = rank // tp``.
Sizes are checked on every rank before the first collective, so a bad configuration fails the same way
everywhere instead of leaving some ranks waiting. Every rank's host name is gathered once, at construction
(untraced: set-up, not model traffic); when the ranks span several hosts the table shows them and warns about a
TP group that crosses between hosts (``tpsim.hosts``).
"""

from __future__ import annotations

import os
import time

import numpy as np
from mpi4py import MPI

from tpsim.comm.group import Group
from tpsim.comm.tracer import Tracer
from tpsim.errors import ConfigError
from tpsim.hosts import FAKE_HOSTS_ENV, host_lines, parse_fake_hosts, row_hosts


def grid_layout(world: int, tp: int, dp: int | None = None) -> np.ndarray:
    """The [dp, tp] array of world ranks, after checking the sizes (pure arithmetic, no MPI)."""
    if tp < 1:
        raise ConfigError(f"tp must be >= 1, got {tp}")
    if world % tp:
        raise ConfigError(f"world size {world} is not divisible by tp={tp} (world must equal tp x dp)")
    if dp is not None and dp * tp != world:
        raise ConfigError(f"tp x dp = {tp} x {dp} = {tp * dp} does not match the world size {world}")
    return np.arange(world).reshape(world // tp, tp)


class ProcessGrid:
    """TP × DP grid over a communicator (default ``MPI.COMM_WORLD``); one tracer shared by all its groups."""

    def __init__(self, tp: int, dp: int | None = None, comm: MPI.Comm | None = None,
                 tracer: Tracer | None = None) -> None:
        comm = MPI.COMM_WORLD if comm is None else comm
        self.world_size = comm.Get_size()
        self.rank = comm.Get_rank()
        self.layout = grid_layout(self.world_size, tp, dp)  # raises before any collective
        fake = os.environ.get(FAKE_HOSTS_ENV)
        my_host = (parse_fake_hosts(fake, self.world_size)[self.rank] if fake  # raises before any collective too
                   else MPI.Get_processor_name())
        self.tp, self.dp = int(self.layout.shape[1]), int(self.layout.shape[0])
        self.tp_rank, self.dp_rank = self.rank % self.tp, self.rank // self.tp
        self.tracer = tracer if tracer is not None else Tracer(rank=self.rank)
        # Communicator creation is set-up, not model traffic: it is not traced.
        tp_comm = comm.Split(color=self.dp_rank, key=self.tp_rank)
        dp_comm = comm.Split(color=self.tp_rank, key=self.dp_rank)
        self.world = Group(comm, "world", tuple(range(self.world_size)), self.tracer)
        self.tp_group = Group(tp_comm, "tp", tuple(self.layout[self.dp_rank].tolist()), self.tracer)
        self.dp_group = Group(dp_comm, "dp", tuple(self.layout[:, self.tp_rank].tolist()), self.tracer)
        with self.tracer.paused():
            self.hosts = gather_host_names(self.world, my_host)  # world rank -> host name, on every rank
        comm.Barrier()  # common clock origin for timelines (ranks on one node share perf_counter)
        self.tracer.reset(t0=time.perf_counter())

    @property
    def tp_groups(self) -> list[list[int]]:
        return self.layout.tolist()

    @property
    def dp_groups(self) -> list[list[int]]:
        return self.layout.T.tolist()

    def describe(self) -> str:
        """This rank's place, e.g. ``TP(4) DP(2) rank 5: tp_rank 1, dp_rank 1``."""
        return f"TP({self.tp}) DP({self.dp}) rank {self.rank}: tp_rank {self.tp_rank}, dp_rank {self.dp_rank}"

    def table(self) -> str:
        return format_grid(self.layout, self.hosts)


def gather_host_names(world: Group, name: str) -> list[str]:
    """Every rank's host name, in world-rank order, on every rank: one all-gather of fixed-width bytes."""
    width = MPI.MAX_PROCESSOR_NAME
    mine = np.zeros(width, dtype=np.uint8)
    encoded = name.encode()[:width]
    mine[:len(encoded)] = np.frombuffer(encoded, dtype=np.uint8)
    rows = world.all_gather(mine, axis=0).reshape(world.size, width)
    return [row.tobytes().rstrip(b"\0").decode(errors="replace") for row in rows]


def format_grid(layout: np.ndarray, hosts: list[str] | None = None) -> str:
    """The grid as text: the rank map, then every TP and DP group (pure formatting, no MPI). ``hosts`` (world
    rank -> host name): when they name more than one host, each row shows its host(s), a line lists every host's
    ranks, and a TP group spanning hosts is warned about."""
    dp, tp = layout.shape
    width = max(4, len(str(layout.size - 1)) + 1)
    extra = host_lines(layout.tolist(), hosts) if hosts else []
    lines = [f"Process grid: TP({tp}) x DP({dp}) = {layout.size} ranks "
             f"(Megatron order: TP ranks consecutive)", ""]
    lines.append(" " * 12 + "".join(f"{'tp' + str(j):>{width}}" for j in range(tp)) + ("   host" if extra else ""))
    for i in range(dp):
        row = layout[i].tolist()
        lines.append(f"{'dp' + str(i):>12}" + "".join(f"{r:>{width}}" for r in row)
                     + (f"   {row_hosts(row, hosts)}" if extra else ""))
    lines.append("")
    lines += [f"  TP group {i}: ranks {list(map(int, layout[i]))}" for i in range(dp)]
    lines += [f"  DP group {j}: ranks {list(map(int, layout[:, j]))}" for j in range(tp)]
    return "\n".join(lines + extra)
