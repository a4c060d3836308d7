"""The process grid: which ranks form each tensor-parallel (TP), data-parallel (DP) and pipeline (PP) group.

Megatron's rank order puts TP ranks next to each other (TP inside a node, over the fast links; DP between
nodes: §3.1 of the SenseParrots article, and Narayanan et al. 2021), then DP, with the pipeline outermost, so
the whole grid is one reshape of the world ranks:

    cube = arange(world).reshape(pp, dp, tp)     # rank = pp_rank·(dp·tp) + dp_rank·tp + tp_rank
    world 8, tp 4          ->  TP [[0,1,2,3],[4,5,6,7]]            DP [[0,4],[1,5],[2,6],[3,7]]
    world 8, tp 2          ->  TP [[0,1],[2,3],[4,5],[6,7]]        DP [[0,2,4,6],[1,3,5,7]]
    world 8, tp 2, pp 2    ->  TP [[0,1],[2,3],[4,5],[6,7]]        DP [[0,2],[1,3],[4,6],[5,7]]
                               PP [[0,4],[1,5],[2,6],[3,7]]        (stage 0 holds ranks 0-3, stage 1 ranks 4-7)

and each rank's coordinates fall out of it: ``tp_rank = rank % tp``, ``dp_rank = rank // tp % dp``,
``pp_rank = rank // (tp·dp)``. ``layout`` is this rank's pipeline stage, the [dp, tp] block of the cube (the
whole grid when pp == 1). A pipeline group holds the ranks with the same tp_rank and dp_rank, in stage order;
with pp > 1 the first and last stage of each also form an *embedding group* (a tied word embedding lives on
both: Megatron's ``_allreduce_word_embedding_grads``), and the TP × PP ranks of one DP replica a
*model-parallel* group (the gradient norm sums over every stage; with pp == 1 it is the TP group itself); the
TP × DP ranks of one stage are its *stage group* (the world when pp == 1).

Context parallelism (``cp > 1``, ``tpsim.cp``) sits between TP and DP, Megatron's order TP, CP, DP, PP:
``rank = pp_rank·(dp·cp·tp) + dp_rank·(cp·tp) + cp_rank·tp + tp_rank``. The CP ranks of one replica hold the
same model shard and different tokens of the same sequences, so the gradients are averaged over DP × CP: the
grid's rows (``cube`` [pp, dp·cp, tp], ``layout``, the group named "dp" and ``replicas`` = dp·cp) are the
(dp_rank, cp_rank) pairs, ``replica_rank = dp_rank·cp + cp_rank``, while ``dp`` and ``dp_rank`` still say which
rows of the global batch a rank reads. A *CP group* ("cp") holds the cp ranks of one replica with the same
tp_rank, in cp_rank order.
Every group is the order string's (``tpsim.rank_grid``, order ``"tp-cp-dp-pp"``): ``grid.group("tp")``,
``grid.group("dp", "cp")`` (the gradient group), ``grid.group("tp", "pp")`` (model-parallel) — a new axis is one more
name in ``ORDER``.
Experts fold the same ranks another way (Parallel Folding, Liu et al. 2025, Megatron-Core's MoE): with ``ep``
given, the ranks of one stage, TP × CP × DP for attention, are also ETP × EP × EDP for the MoE layers, on a second
order string ``EXPERT_ORDER`` ("etp-ep-edp-pp": expert-tensor ranks fastest). ``group("ep")`` holds the ranks
that trade tokens, ``group("etp")`` those sharing one expert's columns, ``group("edp")`` the replicas of one
expert (its gradients are summed there), ``group("ep", "etp")`` the ranks one MoE layer's experts are split
over (``group("ep", "etp", "pp")`` with the stages: the expert norm's); ``group("tp", "cp")`` ("seq") the ranks
holding the tokens of one sequence.
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
from tpsim.comm.expert_grid import EXPERT_ORDER, expert_grid, expert_lines  # noqa: F401 (EXPERT_ORDER re-exported)
from tpsim.rank_grid import RankGrid

ORDER = "tp-cp-dp-pp"  # Megatron's rank order: TP fastest (inside a node), pipeline stages outermost
def grid_layout(world: int, tp: int, dp: int | None = None) -> np.ndarray:
    """The [dp, tp] array of world ranks, after checking the sizes (pure arithmetic, no MPI)."""
    return grid_cube(world, tp, dp)[0]


def grid_cube(world: int, tp: int, dp: int | None = None, pp: int = 1, cp: int = 1) -> np.ndarray:
    """The [pp, dp·cp, tp] array of world ranks, after checking the sizes (pure arithmetic, no MPI): row
    dp_rank·cp + cp_rank of a stage holds CP rank cp_rank of DP replica dp_rank."""
    if cp < 1:
        raise ConfigError(f"cp must be >= 1, got {cp}")
    if cp > 1:
        if world % (tp * pp * cp) or (dp is not None and dp * tp * pp * cp != world):
            raise ConfigError(f"tp x cp x dp x pp = {tp} x {cp} x {dp or '?'} x {pp} does not match the world size "
                              f"{world}")
        return grid_cube(world, tp, None if dp is None else dp * cp, pp)
    if tp < 1:
        raise ConfigError(f"tp must be >= 1, got {tp}")
    if pp < 1:
        raise ConfigError(f"pp must be >= 1, got {pp}")
    if world % (tp * pp):
        what = f"tp={tp}" if pp == 1 else f"tp x pp = {tp} x {pp}"
        raise ConfigError(f"world size {world} is not divisible by {what} "
                          f"(world must equal tp x {'dp' if pp == 1 else 'dp x pp'})")
    if dp is not None and dp * tp * pp != world:
        if pp == 1:
            raise ConfigError(f"tp x dp = {tp} x {dp} = {tp * dp} does not match the world size {world}")
        raise ConfigError(f"tp x dp x pp = {tp} x {dp} x {pp} = {tp * dp * pp} does not match the world size {world}")
    return np.arange(world).reshape(pp, world // (tp * pp), tp)


class ProcessGrid:
    """TP × DP × PP grid over a communicator (default ``MPI.COMM_WORLD``); one tracer shared by all its groups."""

    def __init__(self, tp: int, dp: int | None = None, comm: MPI.Comm | None = None,
                 tracer: Tracer | None = None, *, pp: int = 1, cp: int = 1, ep: int | None = None,
                 etp: int = 1) -> None:
        comm = MPI.COMM_WORLD if comm is None else comm
        self.world_size = comm.Get_size()
        self.rank = comm.Get_rank()
        self.cube = grid_cube(self.world_size, tp, dp, pp, cp)  # raises before any collective
        self.experts = None if ep is None else expert_grid(self.world_size // pp, pp, ep, etp)  # so does this
        fake = os.environ.get(FAKE_HOSTS_ENV)
        my_host = (parse_fake_hosts(fake, self.world_size)[self.rank] if fake  # raises before any collective too
                   else MPI.Get_processor_name())
        self.pp, self.replicas, self.tp = (int(n) for n in self.cube.shape)
        self.cp, self.dp = cp, self.replicas // cp
        self.tp_rank, self.replica_rank = self.rank % self.tp, self.rank // self.tp % self.replicas
        self.dp_rank, self.cp_rank = divmod(self.replica_rank, cp)
        self.pp_rank = self.rank // (self.tp * self.replicas)
        self.layout = self.cube[self.pp_rank]  # this rank's stage: [dp·cp, tp] (the whole grid when pp == 1)
        self.tracer = tracer if tracer is not None else Tracer(rank=self.rank)
        self.ranks = RankGrid(ORDER, {"tp": self.tp, "cp": cp, "dp": self.dp, "pp": self.pp})
        # Communicator creation is set-up, not model traffic: it is not traced. Every group is built here, on every
        # rank (a split is collective); ``group(*axes)`` hands them out.
        self._groups: dict[tuple[str, ...], Group] = {}
        self.world = Group(comm, "world", tuple(range(self.world_size)), self.tracer)
        self.tp_group = self._split(comm, "tp", ("tp",))
        self.dp_group = self._split(comm, "dp", ("cp", "dp"))  # the gradient group: DP × CP, named "dp" in traces
        self.cp_group = self._split(comm, "cp", ("cp",))
        self.pp_group = self._split(comm, "pp", ("pp",))
        self.embedding_group: Group | None = None  # first and last stage of this pipeline group (pp > 1)
        self.model_parallel_group = self.tp_group  # the ranks one model is split over: TP × PP of one replica
        self.stage_group = self.world  # the ranks of this pipeline stage (TP × DP): the world when pp == 1
        if self.pp > 1:
            self.stage_group = self._split(comm, "stage", ("tp", "cp", "dp"))
            ends = self.pp_rank in (0, self.pp - 1)
            chain = self.ranks.color(self.rank, "pp")
            emb_comm = comm.Split(color=chain if ends else MPI.UNDEFINED, key=self.pp_rank)
            if ends:
                self.embedding_group = Group(emb_comm, "embedding", self.pp_group.ranks[::self.pp - 1], self.tracer)
            self.model_parallel_group = self._split(comm, "mp", ("tp", "pp"))
        else:  # one stage: the stage is the world, a model is split over TP alone
            self._groups.update({("cp", "dp", "tp"): self.world, ("pp", "tp"): self.tp_group})
        if self.experts is not None:
            self._fold_experts(comm)
        with self.tracer.paused():
            self.hosts = gather_host_names(self.world, my_host)  # world rank -> host name, on every rank
        comm.Barrier()  # common clock origin for timelines (ranks on one node share perf_counter)
        self.tracer.reset(t0=time.perf_counter())

    def _fold_experts(self, comm: MPI.Comm) -> None:
        """The MoE layers' groups (Parallel Folding, module docstring) and the sequence group TP × CP."""
        self.ep, self.etp, self.edp = (self.experts.sizes[a] for a in ("ep", "etp", "edp"))
        mine = self.experts.coords(self.rank)
        self.ep_rank, self.etp_rank, self.edp_rank = mine["ep"], mine["etp"], mine["edp"]
        for name, axes in (("ep", ("ep",)), ("etp", ("etp",)), ("edp", ("edp",)), ("expert", ("ep", "etp"))):
            self._split(comm, name, axes, self.experts)
        if self.pp > 1:  # the ranks one replica's experts are split over, every stage
            self._split(comm, "expert_mp", ("ep", "etp", "pp"), self.experts)
        else:
            self._groups[("ep", "etp", "pp")] = self._groups[("ep", "etp")]
        if self.cp > 1:
            self._split(comm, "seq", ("tp", "cp"))
        else:
            self._groups[("cp", "tp")] = self.tp_group

    def _split(self, comm: MPI.Comm, name: str, axes: tuple[str, ...], grid: RankGrid | None = None) -> Group:
        """The group over ``axes`` holding this rank (``tpsim.rank_grid``: which one, and this rank's place) on
        ``grid`` (the attention grid unless given)."""
        grid = self.ranks if grid is None else grid
        sub = comm.Split(color=grid.color(self.rank, *axes), key=grid.key(self.rank, *axes))
        group = Group(sub, name, grid.group(self.rank, *axes), self.tracer)
        self._groups[tuple(sorted(axes))] = group
        return group

    def group(self, *axes: str) -> Group:
        """This rank's group over ``axes`` (any order): ``group("tp")``, ``group("dp", "cp")`` — the gradient group,
        DP × CP — ``group("cp")``, ``group("pp")``, ``group("tp", "pp")`` (model-parallel), ``group("tp", "cp",
        "dp")`` (this stage; the world when pp == 1)."""
        found = self._groups.get(tuple(sorted(axes)))
        if found is None:
            built = ", ".join(" x ".join(k) for k in self._groups)
            raise ValueError(f"no group over {' x '.join(axes)} on grid {ORDER!r}: built {built}")
        return found

    @property
    def first_stage(self) -> bool:
        return self.pp_rank == 0

    @property
    def last_stage(self) -> bool:
        return self.pp_rank == self.pp - 1

    @property
    def tp_groups(self) -> list[list[int]]:
        """Every TP group, stage by stage (``[pp_rank·dp + dp_rank]`` is this rank's)."""
        return self.cube.reshape(-1, self.tp).tolist()

    @property
    def dp_groups(self) -> list[list[int]]:
        """Every DP group, stage by stage (``[pp_rank·tp + tp_rank]`` is this rank's)."""
        return self.cube.transpose(0, 2, 1).reshape(-1, self.replicas).tolist()

    @property
    def pp_groups(self) -> list[list[int]]:
        """Every pipeline group, in stage order (``[dp_rank·tp + tp_rank]`` is this rank's)."""
        return self.cube.transpose(1, 2, 0).reshape(-1, self.pp).tolist()

    def describe(self) -> str:
        """This rank's place, e.g. ``TP(4) DP(2) rank 5: tp_rank 1, dp_rank 1`` (``PP(2) ... pp_rank 1`` too)."""
        if self.cp > 1:
            return (f"TP({self.tp}) CP({self.cp}) DP({self.dp}) PP({self.pp}) rank {self.rank}: tp_rank "
                    f"{self.tp_rank}, cp_rank {self.cp_rank}, dp_rank {self.dp_rank}, pp_rank {self.pp_rank}")
        if self.pp == 1:
            return f"TP({self.tp}) DP({self.dp}) rank {self.rank}: tp_rank {self.tp_rank}, dp_rank {self.dp_rank}"
        return (f"TP({self.tp}) DP({self.dp}) PP({self.pp}) rank {self.rank}: tp_rank {self.tp_rank}, "
                f"dp_rank {self.dp_rank}, pp_rank {self.pp_rank}")

    def table(self) -> str:
        text = format_grid(self.cube[0], self.hosts, self.cp) if self.pp == 1 else format_cube(self.cube, self.hosts,
                                                                                               self.cp)
        return text if self.experts is None else text + "\n" + expert_lines(self.experts)


def gather_host_names(world: Group, name: str) -> list[str]:
    """Every rank's host name, in world-rank order, on every rank: one all-gather of fixed-width bytes."""
    width = MPI.MAX_PROCESSOR_NAME
    mine = np.zeros(width, dtype=np.uint8)
    encoded = name.encode()[:width]
    mine[:len(encoded)] = np.frombuffer(encoded, dtype=np.uint8)
    rows = world.all_gather(mine, axis=0).reshape(world.size, width)
    return [row.tobytes().rstrip(b"\0").decode(errors="replace") for row in rows]


def _row_name(i: int, cp: int) -> str:
    return f"dp{i}" if cp == 1 else f"dp{i // cp} cp{i % cp}"


def _rank_rows(layout: np.ndarray, hosts: list[str] | None, extra: bool, width: int, cp: int = 1) -> list[str]:
    """One line per row of a [dp·cp, tp] block: its ranks (and its hosts when ``extra``)."""
    return [f"{_row_name(i, cp):>12}" + "".join(f"{r:>{width}}" for r in row)
            + (f"   {row_hosts(row, hosts)}" if extra else "") for i, row in enumerate(layout.tolist())]


def format_grid(layout: np.ndarray, hosts: list[str] | None = None, cp: int = 1) -> str:
    """The grid as text: the rank map, then every TP and DP group (pure formatting, no MPI). ``hosts`` (world
    rank -> host name): when they name more than one host, each row shows its host(s), a line lists every host's
    ranks, and a TP group spanning hosts is warned about. ``cp``: the rows are (dp, cp) pairs, the DP groups DP
    × CP, and every CP group is listed."""
    rows, tp = layout.shape
    width = max(4, len(str(layout.size - 1)) + 1)
    extra = host_lines(layout.tolist(), hosts) if hosts else []
    sizes = f"TP({tp}) x DP({rows})" if cp == 1 else f"TP({tp}) x CP({cp}) x DP({rows // cp})"
    lines = [f"Process grid: {sizes} = {layout.size} ranks "
             f"(Megatron order: TP ranks consecutive{', then CP' if cp > 1 else ''})", ""]
    lines.append(" " * 12 + "".join(f"{'tp' + str(j):>{width}}" for j in range(tp)) + ("   host" if extra else ""))
    lines += _rank_rows(layout, hosts, bool(extra), width, cp)
    lines.append("")
    lines += [f"  TP group {i}: ranks {list(map(int, layout[i]))}" for i in range(rows)]
    if cp > 1:
        four = layout.reshape(rows // cp, cp, tp)
        lines += [f"  CP group {g}: ranks {list(map(int, ranks))}"
                  for g, ranks in enumerate(four.transpose(0, 2, 1).reshape(-1, cp))]
    what = "DP group" if cp == 1 else "DP x CP group (gradients averaged)"
    lines += [f"  {what} {j}: ranks {list(map(int, layout[:, j]))}" for j in range(tp)]
    return "\n".join(lines + extra)


def format_cube(cube: np.ndarray, hosts: list[str] | None = None, cp: int = 1) -> str:
    """The TP × DP × PP grid as text: one rank map per pipeline stage, then every TP, DP, pipeline and embedding
    group (pure formatting, no MPI); ``hosts`` as for ``format_grid``. ``cp``: rows are (dp, cp) pairs, the DP
    groups DP × CP, and every CP group is listed."""
    pp, dp, tp = cube.shape
    width = max(4, len(str(cube.size - 1)) + 1)
    extra = host_lines(cube.reshape(-1, tp).tolist(), hosts) if hosts else []
    if cp == 1:
        sizes, order = f"TP({tp}) x DP({dp}) x PP({pp})", f"rank = pp_rank·{dp * tp} + dp_rank·{tp} + tp_rank"
    else:
        sizes = f"TP({tp}) x CP({cp}) x DP({dp // cp}) x PP({pp})"
        order = f"rank = pp_rank·{dp * tp} + dp_rank·{cp * tp} + cp_rank·{tp} + tp_rank"
    lines = [f"Process grid: {sizes} = {cube.size} ranks (Megatron order: TP ranks consecutive, then "
             f"{'CP, then ' if cp > 1 else ''}DP, pipeline stages outermost: {order})", ""]
    for k in range(pp):
        lines.append(f"{'stage ' + str(k):>12}" + "".join(f"{'tp' + str(j):>{width}}" for j in range(tp))
                     + ("   host" if extra else ""))
        lines += _rank_rows(cube[k], hosts, bool(extra), width, cp)
    lines.append("")
    lines += [f"  TP group {i}: ranks {g}" for i, g in enumerate(cube.reshape(-1, tp).tolist())]
    if cp > 1:
        four = cube.reshape(pp, dp // cp, cp, tp).transpose(0, 1, 3, 2).reshape(-1, cp)
        lines += [f"  CP group {g}: ranks {list(map(int, ranks))}" for g, ranks in enumerate(four)]
    what = "DP group" if cp == 1 else "DP x CP group"
    lines += [f"  {what} {j}: ranks {g}" for j, g in enumerate(cube.transpose(0, 2, 1).reshape(-1, dp).tolist())]
    chains = cube.transpose(1, 2, 0).reshape(-1, pp).tolist()
    lines += [f"  PP group {c}: ranks {g} (stage order)" for c, g in enumerate(chains)]
    lines += [f"  embedding group {c}: ranks {[g[0], g[-1]]} (first and last stage)" for c, g in enumerate(chains)]
    return "\n".join(lines + extra)
