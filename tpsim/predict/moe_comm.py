"""The collectives of a mixture of experts in one step, from the routing the run recorded (``tpsim.ep.record``).

How many rows an all-to-all-v moves depends on where the router sent the tokens, so these formulas read the
step's routing: ``counts[r, i, j, e]``, the assignments rank r kept for expert e in MoE layer i, micro-batch j.
With R = h·e bytes a row, for rank r of an EP group (EP rank q, experts X_q = [q·E/ep, (q+1)·E/ep)):

    sent_r = Σ_e counts_r[e]        own_r = Σ_{e ∈ X_q} counts_r[e]        recv_r = Σ_{s ∈ EP group} counts_s[X_q]

    all-to-all dispatcher, per layer and micro-batch (Megatron-LM's; ``tpsim.ep.dispatch``)
      forward   all_to_all    ep   1   the counts, int64 [E]                      wire (ep − 1)/ep of them
                all_gather    etp  1   every ETP rank's counts, int64 [etp·E]     (etp > 1)
                all_to_all_v  ep   2   dispatch sent_r·R (wire (sent_r − own_r)·R), combine recv_r·R
                                       (wire (recv_r − own_r)·R)
                all_gather_v  etp  1   Σ_{ETP group} recv·R, wire recv_r·R·(etp − 1)          (etp > 1)
                reduce_scatter_v etp 1 Σ_{ETP group} recv·R, wire (Σ − recv_r)·R               (etp > 1)
      backward  the same all_to_all_v, all_gather_v and reduce_scatter_v (no counts: the forward's)
    all-gather dispatcher over the expert group (G = ep·etp ranks, T tokens a rank, k choices)
      forward   all_gather 1 (the sizes, int64 [G]), all_gather_v 3 (X, the choices int64 [T, k], the weights
                [T, k]) and reduce_scatter_v 1 (the outputs): each G times a rank's piece, wire (G − 1) pieces
      backward  all_gather_v 1 (dY), reduce_scatter_v 2 (dX, the weights' gradient)
    the router, per layer and micro-batch, where its sequences span more than one rank (SP, CP) and an
      auxiliary loss is on: all_reduce of float64 [b, 2E + 1] over TP × CP (``tpsim.ep.stats``)
    under SP, per layer and micro-batch: the router's gate gradient [h, E] all-reduced over TP (sp_grad_sync)

A measured trace averages over every rank of the world, and so do these rows (Σ over ranks ÷ world). Pure
arithmetic, no MPI.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tpsim.cost import wire_bytes
from tpsim.phases import BACKWARD, FORWARD, SP_GRAD_SYNC


@dataclass(frozen=True)
class Fold:
    """Where a rank sits on the expert grid (``tpsim.comm.grid.expert_grid``, order etp-ep-edp-pp)."""

    ep: int
    etp: int
    stage: int  # ranks of a stage

    def coords(self, rank: int) -> tuple[int, int, int]:
        """(etp rank, ep rank, the rest: edp rank + edp·pp rank) of ``rank``."""
        return rank % self.etp, rank // self.etp % self.ep, rank // (self.etp * self.ep)

    def ep_group(self, rank: int) -> list[int]:
        t, _, rest = self.coords(rank)
        return [t + self.etp * (q + self.ep * rest) for q in range(self.ep)]

    def etp_group(self, rank: int) -> list[int]:
        _, q, rest = self.coords(rank)
        return [t + self.etp * (q + self.ep * rest) for t in range(self.etp)]


def alltoall_totals(counts: np.ndarray, holders: list[list[int]], fold: Fold, row: int) -> dict:
    """Σ over ranks of ``(calls, bytes, wire)`` per (layer index, phase, op, group) of the all-to-all dispatcher."""
    E = counts.shape[-1]
    per = E // fold.ep
    out: dict[tuple, list[int]] = {}

    def add(i, phase, op, group, nbytes, wire, calls=1):
        t = out.setdefault((i, phase, op, group), [0, 0, 0])
        t[0], t[1], t[2] = t[0] + calls, t[1] + nbytes, t[2] + wire

    for i, ranks in enumerate(holders):
        for j in range(counts.shape[2]):
            c = counts[:, i, j]  # [ranks, E]
            own = {r: int(c[r, fold.coords(r)[1] * per:(fold.coords(r)[1] + 1) * per].sum()) for r in ranks}
            recv = {r: int(sum(c[s, fold.coords(r)[1] * per:(fold.coords(r)[1] + 1) * per].sum()
                               for s in fold.ep_group(r))) for r in ranks}
            for r in ranks:
                sent = int(c[r].sum())
                add(i, FORWARD, "all_to_all", "ep", E * 8, wire_bytes("all_to_all", E * 8, fold.ep))
                if fold.etp > 1:
                    add(i, FORWARD, "all_gather", "etp", fold.etp * E * 8,
                        wire_bytes("all_gather", fold.etp * E * 8, fold.etp))
                for phase in (FORWARD, BACKWARD):
                    add(i, phase, "all_to_all_v", "ep", (sent + recv[r]) * row,
                        (sent - own[r] + recv[r] - own[r]) * row, calls=2)
                    if fold.etp > 1:
                        gathered = sum(recv[q] for q in fold.etp_group(r))
                        add(i, phase, "all_gather_v", "etp", gathered * row, recv[r] * row * (fold.etp - 1))
                        add(i, phase, "reduce_scatter_v", "etp", gathered * row, (gathered - recv[r]) * row)
    return out


def allgather_totals(holders: list[list[int]], m: int, fold: Fold, tokens: int, hidden: int, k: int, e: int,
                     ew: int) -> dict:
    """Σ over ranks of ``(calls, bytes, wire)`` of the all-gather dispatcher (``tokens`` a rank a micro-batch;
    ``e`` bytes an activation element, ``ew`` a routing weight's)."""
    G = fold.ep * fold.etp
    x, choice, w = tokens * hidden * e, tokens * k * 8, tokens * k * ew
    out = {}
    for i, ranks in enumerate(holders):
        n = len(ranks) * m
        rows = {(FORWARD, "all_gather"): (1, G * 8, (G - 1) * 8),
                (FORWARD, "all_gather_v"): (3, G * (x + choice + w), (G - 1) * (x + choice + w)),
                (FORWARD, "reduce_scatter_v"): (1, G * x, (G - 1) * x),
                (BACKWARD, "all_gather_v"): (1, G * x, (G - 1) * x),
                (BACKWARD, "reduce_scatter_v"): (2, G * (x + w), (G - 1) * (x + w))}
        for (phase, op), (calls, nbytes, wire) in rows.items():
            out[(i, phase, op, "expert")] = [calls * n, nbytes * n, wire * n]
    return out


def router_totals(holders: list[list[int]], m: int, *, sequence_ranks: int, aux: bool, b: int, experts: int,
                  hidden: int, sp: bool, tp: int, acc: int, sequence_group: str) -> dict:
    """Σ over ranks of the router's collectives: its statistics over the sequence group, its SP gradient sync."""
    out = {}
    for i, ranks in enumerate(holders):
        n = len(ranks)
        if aux and sequence_ranks > 1:
            nbytes = b * (2 * experts + 1) * 8
            out[(i, FORWARD, "all_reduce", sequence_group)] = [n * m, n * m * nbytes,
                                                              n * m * wire_bytes("all_reduce", nbytes, sequence_ranks)]
        if sp:
            nbytes = hidden * experts * acc
            out[(i, SP_GRAD_SYNC, "all_reduce", "tp")] = [n * m, n * m * nbytes,  # each backward's W, as SP's norms
                                                        n * m * wire_bytes("all_reduce", nbytes, tp)]
    return out


def moe_predictions(run, routing, world: int) -> list:
    """The rows above for ``run`` (a ``tpsim.config.RunConfig`` with experts) and the step's ``routing``
    (``tpsim.ep.record.Routing``), as ``Prediction``s averaged over the ``world`` ranks."""
    from tpsim.nn.precision import accum_itemsize
    from tpsim.predict.formulas import Prediction

    config, par, ex = run.model, run.parallel, run.experts
    fold = Fold(ex.ep, ex.etp, par.tp * par.cp * par.dp)
    e, acc = run.precision.numpy.itemsize, accum_itemsize(run.precision.numpy)
    s_local = run.schedule.seq_len // par.cp // (par.tp if par.sp else 1)
    m, b = run.pipeline.microbatches, run.micro_batch
    if ex.dispatcher == "alltoall":
        totals = alltoall_totals(routing.counts, routing.holders, fold, config.hidden * e)
    else:
        totals = allgather_totals(routing.holders, m, fold, b * s_local, config.hidden, config.num_experts_per_tok,
                                  e, e)
    aux = bool(config.router_aux_loss_coef or config.router_z_loss_coef)
    totals.update(router_totals(routing.holders, m, sequence_ranks=par.tp * par.cp, aux=aux, b=b,
                                experts=config.num_local_experts, hidden=config.hidden, sp=par.sp, tp=par.tp,
                                acc=acc, sequence_group="tp" if par.cp == 1 else "seq"))
    sizes = {"ep": ex.ep, "etp": ex.etp, "expert": ex.ep * ex.etp, "tp": par.tp, "seq": par.tp * par.cp}
    return [Prediction(routing.layers[i], phase, op, group, sizes[group], calls / world, nbytes / world, wire / world)
            for (i, phase, op, group), (calls, nbytes, wire) in totals.items()]


def expert_stage_rows(run, rows, layers: list[int], *, clip: bool) -> int:
    """A stage's rows that experts change, in place: the expert buckets' all-reduce over expert-DP (the dense
    ones stay ``ddp`` over DP × CP, ``tpsim.train.expert_sync``), the norm's second all-reduce over the expert
    groups (``tpsim.train.expert_norm``). Returns None: the bucket bytes and counts the caller had are the
    two kinds together, so the dense ones come from the formula and the counts are not predicted."""
    from tpsim.nn.precision import accum_itemsize
    from tpsim.phases import DP_SYNC, OPTIMIZER
    from tpsim.predict.formulas import Prediction

    config, par, ex = run.model, run.parallel, run.experts
    moe = sum(1 for i in layers if config.moe_layer(i))
    elements = moe * config.num_local_experts // ex.ep * 3 * config.hidden * config.intermediate_size // ex.etp
    edp = par.tp * par.cp * par.dp // (ex.ep * ex.etp)
    if edp > 1 and elements:
        n = elements * accum_itemsize(run.precision.numpy)
        rows.rows[("ddp", DP_SYNC, "all_reduce", "edp")] = Prediction("ddp", DP_SYNC, "all_reduce", "edp", edp, None, n,
                                                                     wire_bytes("all_reduce", n, edp))
    if clip:
        group = "expert_mp" if par.pp > 1 else "expert"
        size = ex.ep * ex.etp * par.pp
        rows.rows[("clip_grad_norm", OPTIMIZER, "all_reduce", group)] = Prediction(
            "clip_grad_norm", OPTIMIZER, "all_reduce", group, size, 1, 8, wire_bytes("all_reduce", 8, size))
    return None


def mlp_copies(config, chunks) -> dict[str, int] | None:
    """Per block of ``chunks`` (layer ranges), its TP-parallel MLPs when it is a MoE layer: its shared experts."""
    if not getattr(config, "num_local_experts", 0):
        return None
    return {f"{config.layer_names.block}.{i}": config.shared_experts for layers in chunks for i in layers
            if config.moe_layer(i)}
