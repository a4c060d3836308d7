"""A mixture-of-experts layer under expert parallelism, built from the serial layer's master weights.

    x [b, s_local, h] -> X [T, h]                 this rank's tokens (under SP/CP a part of each sequence)
    (index, w) = router(X)                        local: the router's weight is on every rank
    capacity per rank: C = ⌈c · T·k / E⌉          the serial layer's rule on this rank's tokens (its group)
    y = dispatcher(X, kept assignments, w)        all-to-all-v or all-gather (``tpsim.ep.dispatch``)
      + shared(X) [· σ(X · g)]                    the shared experts on the local tokens (under SP: TP-split)

**Parallel Folding** (Liu et al. 2025, "MoE Parallel Folding"): the ranks that hold attention as TP × CP × DP
hold this layer as ETP × EP × EDP (``tpsim.comm.grid``). The layer reads three groups: ``ep`` (tokens are
traded there), ``etp`` (an expert's columns), ``expert`` (EP × ETP, the all-gather dispatcher's); and the
sequence group TP × CP for the auxiliary losses (``tpsim.ep.stats``). Its gradients go two ways:

    router, shared experts (dense)    averaged over DP × CP like attention's (under SP the replicated router
                                      and gate summed over TP first, in the backward: their W all-reduces)
    experts                           summed over EDP, then divided by dp·cp (Megatron-Core's
                                      expert_gradient_scaling_factor): every expert saw tokens of dp·cp
                                      replicas, each token's gradient weighed by its own replica's loss

``backward`` leaves both as this rank's sums; the data-parallel step reduces them. With m micro-batches a step
(``microbatches``) each forward's auxiliary losses weigh 1/m, as the language-model loss's micro-batches do. Tensor parallelism needs
sequence parallelism here (Megatron-LM's rule), so that the ranks of a TP group hold different tokens.
"""

from __future__ import annotations

import copy
from typing import NamedTuple

import numpy as np

from tpsim.comm import ProcessGrid
from tpsim.ep.dispatch import AllGatherDispatcher, AllToAllDispatcher
from tpsim.ep.experts import LocalExperts
from tpsim.ep.shuffle import expert_major
from tpsim.ep.stats import sequence_stats
from tpsim.errors import ConfigError
from tpsim.nn.module import Module
from tpsim.nn.moe import MoE, assignments, shared_backward, shared_forward
from tpsim.nn.router import RouterCache
from tpsim.phases import BACKWARD, FORWARD
from tpsim.tp.regions import SP_REGION, Region, SequenceParallelRegion
from tpsim.tp.sp_replicated_linear import SequenceParallelReplicatedLinear
from tpsim.tp.swiglu import ParallelSwiGLU

DISPATCHERS = ("alltoall", "allgather")


class EPCache(NamedTuple):
    router: RouterCache
    routed: tuple  # the dispatcher's cache
    shared: tuple
    shared_out: np.ndarray | None
    gate: tuple | None
    dropped: int
    load: np.ndarray  # int [E]: this rank's kept assignments per expert (after capacity)
    shape: tuple


class ExpertParallelMoE(Module):
    """The router (replicated), this rank's experts (``LocalExperts``), the shared experts (TP-split like a dense
    MLP) and Qwen2-MoE's shared-expert gate (replicated), with ``dispatcher`` between them. ``log``: per forward,
    the kept assignments per expert, the dropped ones and the auxiliary losses (the run's routing record), emptied
    by ``tpsim.ep.record.collect`` once a step (a loop that never collects keeps one entry per forward)."""

    def __init__(self, serial: MoE, grid: ProcessGrid, dispatcher: str = "alltoall", *,
                 region: Region = SP_REGION, microbatches: int = 1) -> None:
        super().__init__()
        if grid.experts is None:
            raise ConfigError("an expert-parallel layer needs a grid built with ep (ProcessGrid(..., ep=...))")
        if dispatcher not in DISPATCHERS:
            raise ConfigError(f"dispatcher {dispatcher!r}: one of {', '.join(DISPATCHERS)}")
        E = len(serial.experts)
        if E % grid.ep:
            raise ConfigError(f"{E} experts do not divide over ep {grid.ep}: each EP rank holds E/ep experts")
        tp = grid.tp_group
        if tp.size > 1 and not isinstance(region, SequenceParallelRegion):
            raise ConfigError(f"experts with tp {tp.size} need sequence parallelism (--sequence-parallel): the "
                              "ranks of a TP group must hold different tokens to route (Megatron-LM's rule)")
        self.router = copy.deepcopy(serial.router)
        self.experts = LocalExperts.from_serial(serial.experts, grid.ep, grid.ep_rank, grid.etp, grid.etp_rank)
        self.shared_expert_gate = copy.deepcopy(serial.shared_expert_gate)
        if isinstance(region, SequenceParallelRegion):  # replicated weights on SP tokens: gradients summed over TP
            self.router.gate = SequenceParallelReplicatedLinear(serial.router.gate, tp)
            if self.shared_expert_gate is not None:
                self.shared_expert_gate = SequenceParallelReplicatedLinear(serial.shared_expert_gate, tp)
        self.shared_experts = [ParallelSwiGLU.from_serial(m, tp, region=region) for m in serial.shared_experts]
        self.capacity_factor, self.num_experts = serial.capacity_factor, E
        self.capacity = serial.capacity
        self.grid, self.dispatcher_name, self.microbatches = grid, dispatcher, microbatches
        self.sequence_group = grid.group("tp", "cp")
        self.log: list[tuple[np.ndarray, int, float, float]] = []  # per forward: (load [E], dropped, L_aux, L_z)
        self.dispatcher = (AllToAllDispatcher(grid.group("ep"), grid.group("etp")) if dispatcher == "alltoall"
                           else AllGatherDispatcher(grid.group("ep", "etp"), self.experts))

    def forward(self, x: np.ndarray) -> tuple[np.ndarray, EPCache]:
        """``x: [b, s_local, h]`` (this rank's tokens) -> ``(y shaped as x, EPCache)``."""
        X = x.reshape(-1, x.shape[-1])
        stats = sequence_stats(x.shape, self.sequence_group, self.grid.tp, self.microbatches)
        with self.grid.tracer.region(scope=self.path, phase=FORWARD):  # the router's counts, the dispatch
            (index, weights), c_router = self.router.forward(X, stats)
            rows, slots, dropped = assignments(index, self.num_experts, self.capacity(len(X)))
            tokens, slot, counts = expert_major(rows, slots)
            y, routed = self.dispatcher.forward(X, tokens, slot, counts, weights, self.experts)
        self.log.append((counts, dropped, c_router.aux_loss, c_router.z_loss))
        y = y.reshape(x.shape)
        shared, shared_out, gate = shared_forward(self.shared_experts, self.shared_expert_gate, x, y)  # SP: 3-D
        return y, EPCache(c_router, routed, shared, shared_out, gate, dropped, counts, x.shape)

    def backward(self, dy: np.ndarray, cache: EPCache) -> np.ndarray:
        """``dy`` shaped as the output -> ``dx``; adds into this rank's expert, router and shared gradients."""
        dY = dy.reshape(-1, dy.shape[-1])
        with self.grid.tracer.region(scope=self.path, phase=BACKWARD):
            dX, dweights = self.dispatcher.backward(dY, cache.routed, self.experts, self.router.top)
        dX += self.router.backward(dweights, cache.router)
        dX = dX.reshape(cache.shape)
        shared_backward(self.shared_experts, self.shared_expert_gate, dy, dX, cache)
        return dX

    def __repr__(self) -> str:
        g = self.grid
        return (f"ExpertParallelMoE({self.num_experts} experts, {len(self.experts.ids)} here "
                f"{list(self.experts.ids)}, ep {g.ep}, etp {g.etp}, edp {g.edp}, {self.dispatcher_name})")
