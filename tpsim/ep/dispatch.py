"""The token dispatchers of expert parallelism: how a rank's routed tokens reach their experts and come back.

**all-to-all** (Megatron-LM's ``MoEAlltoAllTokenDispatcher``; GShard, Lepikhin et al. 2021):

    forward   counts: all_to_all [ep, E/ep] int64        how many rows each source sends each local expert
              dispatch: all_to_all_v of the rows X[t]    expert-major out, source-major in (``tpsim.ep.shuffle``)
              ETP > 1: all_gather_v over ETP             each ETP rank runs its columns on the group's rows
              experts (grouped)                          regrouped expert-major, run, regrouped back
              ETP > 1: reduce_scatter_v over ETP         the partial outputs summed, each rank its rows
              combine: all_to_all_v back                 rows return to their source, in the sent order
              y_t += w_tj · out_tj                       weighted on the source, expert by expert
    backward  the same path with dY_t · w_tj (no count exchange: the forward's), and dw_tj = dY_t · out_tj

**all-gather** (Megatron-LM's ``MoEAllGatherTokenDispatcher``): every rank of the expert group (EP × ETP)
gathers every token and its routing (all_gather_v of X, the kept choices and their weights), runs its local
experts on the tokens routed to them, and a reduce_scatter_v sums the weighted partial outputs back to their
owners. It moves every token to every rank — (p − 1)·T·h per rank against the all-to-all's k·T·h·(ep − 1)/ep
on average — which is why large EP uses the all-to-all; a learner compares them in the trace.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from tpsim.comm import Group
from tpsim.ep.experts import LocalExperts
from tpsim.ep.shuffle import regroup, scatter_weighted


class Plan(NamedTuple):
    """One all-to-all dispatch: counts by rank and expert, and the regrouping to expert-major."""

    send: np.ndarray  # [ep] rows sent to each EP rank
    recv: np.ndarray  # [ep] rows received from each
    peers: np.ndarray  # [etp] rows each ETP rank brought (after the all-to-all)
    order: np.ndarray  # source-major -> expert-major
    expert_counts: np.ndarray  # [E/ep] rows of each local expert


class AllToAllDispatcher:
    """Tokens to their experts' EP ranks and back by all-to-all-v (module docstring)."""

    name = "alltoall"

    def __init__(self, ep: Group, etp: Group) -> None:
        self.ep, self.etp = ep, etp

    def _plan(self, counts: np.ndarray) -> Plan:
        mine = counts.reshape(self.ep.size, -1)  # [ep, E/ep]: to each EP rank, per expert of it
        per_source = self.ep.all_to_all(mine, 0, 0)  # [ep, E/ep]: from each source, per local expert
        blocks = self.etp.all_gather(per_source, axis=0) if self.etp.size > 1 else per_source
        peers = blocks.reshape(self.etp.size, -1).sum(axis=1)
        return Plan(mine.sum(axis=1), per_source.sum(axis=1), peers, regroup(blocks), blocks.sum(axis=0))

    def _to_experts(self, rows: np.ndarray, plan: Plan) -> np.ndarray:
        rows, _ = self.ep.all_to_all_v(rows, plan.send, plan.recv)
        if self.etp.size > 1:
            rows, _ = self.etp.all_gather_v(rows, plan.peers)
        return rows[plan.order]

    def _from_experts(self, rows: np.ndarray, plan: Plan) -> np.ndarray:
        back = np.empty_like(rows)
        back[plan.order] = rows
        if self.etp.size > 1:
            back = self.etp.reduce_scatter_v(back, plan.peers)
        return self.ep.all_to_all_v(back, plan.recv, plan.send)[0]

    def forward(self, X: np.ndarray, tokens: np.ndarray, slots: np.ndarray, counts: np.ndarray,
                weights: np.ndarray, experts: LocalExperts):
        """X [T, h]; the kept assignments expert-major (``tokens``, ``slots``, ``counts`` per expert) ->
        (y [T, h]: Σ weights · expert outputs, cache)."""
        plan = self._plan(counts)
        out, caches = experts.forward(self._to_experts(X[tokens], plan), plan.expert_counts)
        back = self._from_experts(out, plan)
        w = weights[tokens, slots]
        y = np.zeros_like(X)
        scatter_weighted(y, tokens, counts, back, w)
        return y, (plan, tokens, slots, counts, w, back, caches)

    def backward(self, dY: np.ndarray, cache, experts: LocalExperts, k: int) -> tuple[np.ndarray, np.ndarray]:
        """dY [T, h] -> (dX [T, h] through the experts, dweights [T, k])."""
        plan, tokens, slots, counts, w, back, caches = cache
        d_rows = experts.backward(self._to_experts(dY[tokens] * w[:, None], plan), plan.expert_counts, caches)
        d_back = self._from_experts(d_rows, plan)
        dX = np.zeros_like(dY)
        scatter_weighted(dX, tokens, counts, d_back, None)
        dweights = np.zeros((len(dY), k), dtype=dY.dtype)
        dweights[tokens, slots] = (dY[tokens] * back).sum(axis=-1)
        return dX, dweights


class AllGatherDispatcher:
    """Every token to every rank of the expert group, partial outputs reduce-scattered back (module docstring)."""

    name = "allgather"

    def __init__(self, group: Group, experts: LocalExperts) -> None:
        self.group, self.ids = group, experts.ids

    def forward(self, X: np.ndarray, tokens: np.ndarray, slots: np.ndarray, counts: np.ndarray,
                weights: np.ndarray, experts: LocalExperts):
        k = weights.shape[1]
        chosen = np.full((len(X), k), -1, dtype=np.int64)  # the kept choices; -1: dropped
        start = 0
        for e, n in enumerate(counts):
            chosen[tokens[start:start + n], slots[start:start + n]] = e
            start += n
        X_all, sizes = self.group.all_gather_v(X)
        chosen_all = self.group.all_gather_v(chosen, sizes)[0]
        weights_all = self.group.all_gather_v(weights, sizes)[0]
        mine = [np.nonzero(chosen_all == e) for e in self.ids]  # token order of the gathered rows
        t_all = np.concatenate([t for t, _ in mine]).astype(np.int64)
        j_all = np.concatenate([j for _, j in mine]).astype(np.int64)
        local_counts = np.array([len(t) for t, _ in mine], dtype=np.int64)
        out, caches = experts.forward(X_all[t_all], local_counts)
        w = weights_all[t_all, j_all]
        y_all = np.zeros_like(X_all)
        scatter_weighted(y_all, t_all, local_counts, out, w)
        return self.group.reduce_scatter_v(y_all, sizes), (sizes, t_all, j_all, local_counts, w, out, caches)

    def backward(self, dY: np.ndarray, cache, experts: LocalExperts, k: int) -> tuple[np.ndarray, np.ndarray]:
        sizes, t_all, j_all, local_counts, w, out, caches = cache
        dY_all = self.group.all_gather_v(dY, sizes)[0]
        d_rows = experts.backward(dY_all[t_all] * w[:, None], local_counts, caches)
        dX_all = np.zeros_like(dY_all)
        scatter_weighted(dX_all, t_all, local_counts, d_rows, None)
        dweights_all = np.zeros((len(dY_all), k), dtype=dY.dtype)
        dweights_all[t_all, j_all] = (dY_all[t_all] * out).sum(axis=-1)  # partial under ETP: the sum is exact
        return self.group.reduce_scatter_v(dX_all, sizes), self.group.reduce_scatter_v(dweights_all, sizes)
