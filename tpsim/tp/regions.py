"""Entering and leaving the tensor-parallel region: the pair (f, g) or (f̄, ḡ), chosen once when a layer is built.

A column-parallel layer (the LM head included) is where an activation *enters* a partitioned computation; a
row-parallel layer is where partial results *leave* it. Plain TP joins them to the replicated regions with
the conjugate pair of Shoeybi et al. 2019 (Megatron-LM, §3 and Fig. 3); sequence parallelism (Korthikanti et
al. 2022, §4.2.2) keeps the replicated regions split along the sequence and swaps in their sequence twins:

                        enter (column-parallel input)           leave (row-parallel output)
    ``TP_REGION``       f  = identity  | all-reduce               g  = all-reduce      | identity
    ``SP_REGION``       f̄  = all-gather s | reduce-scatter s       ḡ  = reduce-scatter s | all-gather s
                        (forward | backward)

A layer is given one of the two regions at construction and calls it without asking which it is. A layer
that enters the region needs its whole input again in the backward (for ``dW = xᵀ·dy``): under f it kept that
input; under f̄ it keeps only the [b, s/p, h] shard it was given — keeping f̄'s gathered output would undo the
memory SP saves — and ``regather`` all-gathers it once more, as Megatron does.

The layers call the collectives together with the GEMMs beside them (``enter_matmul``, ``matmul_enter_backward``,
``matmul_leave``, ``leave_backward_matmul``): under TP the collective and one GEMM, as before; under SP the GEMMs
run per sequence chunk, the f̄/ḡ collectives chunked beside them (``tpsim.tp.collective_matmul``), blocking or,
``SP_OVERLAP_REGION`` (``--tp-comm-overlap``), pipelined with them — the same bits either way.

``enter_backward`` and ``leave`` are handed a fresh partial sum (a GEMM's output) that the caller never reads
again, so g's and f's all-reduce sum into it in place (no second buffer).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from tpsim.comm import Group
from tpsim.partition import within
from tpsim.phases import BACKWARD, FORWARD
from tpsim.tp.collective_matmul import gather_matmul, matmul_scatter, times
from tpsim.tp.mappings import CopyToTPRegion, ReduceFromTPRegion
from tpsim.nn.dropout import DropoutPlan
from tpsim.tp.sequence_parallel import (GatherFromSequenceParallelRegion, ReduceScatterToSequenceParallelRegion,
                                        ScatterToSequenceParallelRegion, check_sequence_length, gather_sequence,
                                        sequence_partition)


class TensorParallelRegion:
    """(f, g): the regions around the partitioned layers hold whole ``[..., h]`` activations on every rank."""

    name = "tp"
    splits_sequence = False  # what a constructor checks its layout against; never read in a forward

    def enter(self, x: np.ndarray, group: Group) -> np.ndarray:
        """f: ``x [..., h]`` replicated, returned as is."""
        return CopyToTPRegion.forward(x, group)

    def enter_backward(self, dx: np.ndarray, group: Group) -> np.ndarray:
        """f backward: all-reduce the partial input gradient ``[..., h]`` (in place: see the module docstring)."""
        return CopyToTPRegion.backward(dx, group, inplace=True)

    def regather(self, saved: np.ndarray, group: Group) -> np.ndarray:
        """The layer's whole input again, in the backward: f's layer kept it whole."""
        return saved

    def leave(self, partial: np.ndarray, group: Group) -> np.ndarray:
        """g: all-reduce the partial sums ``[..., h]`` (in place)."""
        return ReduceFromTPRegion.forward(partial, group, inplace=True)

    def leave_backward(self, dz: np.ndarray, group: Group) -> np.ndarray:
        """g backward: ``dz [..., h]`` as is (every term of a sum gets the same gradient)."""
        return ReduceFromTPRegion.backward(dz, group)

    # --- the collectives with the GEMMs beside them (what the layers call; ``SequenceParallelRegion`` chunks them)
    def enter_matmul(self, x: np.ndarray, weights, group: Group) -> list[np.ndarray]:
        """f, then ``x·W_i`` for each weight: ``x [..., k]`` -> ``[..., n_i]`` (a column-parallel forward)."""
        full = self.enter(x, group)
        return [times(full, w) for w in weights]

    def matmul_enter_backward(self, dys, weights, group: Group) -> np.ndarray:
        """``Σ_i dy_i·W_iᵀ`` (in order), then f backward: the summed input gradient ``[..., k]``."""
        dx = None
        for dy, w in zip(dys, weights):
            d = times(dy, w.T)
            dx = d if dx is None else np.add(dx, d, out=dx)
        return self.enter_backward(dx, group)

    def matmul_leave(self, y: np.ndarray, w: np.ndarray, group: Group) -> np.ndarray:
        """``y·B``, then g: ``y [..., k/p]`` -> ``[..., n]`` (a row-parallel forward, bias not added)."""
        return self.leave(times(y, w), group)

    def leave_backward_matmul(self, dz: np.ndarray, w: np.ndarray, group: Group) -> tuple[np.ndarray, np.ndarray]:
        """g backward, then ``dz·Bᵀ``: ``(dz as the weight gradient needs it, dy [..., k/p])``."""
        dz = self.leave_backward(dz, group)
        return dz, times(dz, w.T)

    def sequence_length(self, local: int, group: Group) -> int:
        """The whole sequence the partitioned layers see, from the length a rank holds: the same."""
        return local

    # --- the model's edge: where the embedding's output enters the blocks (``tpsim.models.gpt.Transformer``) ---
    def check_sequence(self, seq_len: int, group: Group | None) -> None:
        """Any length will do: nothing is split."""

    def split_sequence(self, x: np.ndarray, plan: DropoutPlan, group: Group | None) -> tuple[np.ndarray, DropoutPlan]:
        """``x [b, s, h]`` and the dropout plan as they are (also the serial model's edge: no group)."""
        return x, plan

    def split_sequence_backward(self, dx: np.ndarray, group: Group | None, scope: str) -> np.ndarray:
        """``dx [b, s, h]`` as is."""
        return dx

    def __repr__(self) -> str:
        return "TP_REGION"


class SequenceParallelRegion:
    """(f̄, ḡ): the regions around the partitioned layers hold this rank's positions ``[b, s/p, h]``.

    The layers' GEMMs beside f̄ and ḡ run per sequence chunk (``tpsim.tp.collective_matmul``); ``overlap``
    (``--tp-comm-overlap``): the chunks move step by step while the GEMM of the chunk already here runs."""

    name = "sp"
    splits_sequence = True

    def __init__(self, overlap: bool = False) -> None:
        self.overlap = overlap

    def enter(self, x: np.ndarray, group: Group) -> np.ndarray:
        """f̄: all-gather ``x_r [b, s/p, h]`` to ``[b, s, h]``."""
        return GatherFromSequenceParallelRegion.forward(x, group)

    def enter_backward(self, dx: np.ndarray, group: Group) -> np.ndarray:
        """f̄ backward: reduce-scatter the partial input gradient ``[b, s, h]`` to ``[b, s/p, h]``."""
        return GatherFromSequenceParallelRegion.backward(dx, group)

    def regather(self, saved: np.ndarray, group: Group) -> np.ndarray:
        """The layer's whole input again, in the backward: all-gather the shard its cache kept."""
        return gather_sequence(saved, group, BACKWARD)

    def leave(self, partial: np.ndarray, group: Group) -> np.ndarray:
        """ḡ: reduce-scatter the partial sums ``[b, s, h]`` to this rank's ``[b, s/p, h]``."""
        return ReduceScatterToSequenceParallelRegion.forward(partial, group)

    def leave_backward(self, dz: np.ndarray, group: Group) -> np.ndarray:
        """ḡ backward: all-gather ``dz_r [b, s/p, h]`` to ``[b, s, h]``."""
        return ReduceScatterToSequenceParallelRegion.backward(dz, group)

    def enter_matmul(self, x: np.ndarray, weights, group: Group) -> list[np.ndarray]:
        """f̄ and ``x·W_i``: ``x_r [b, s/p, k]`` -> ``[b, s, n_i]``, chunk by chunk (phase forward)."""
        with group.tracer.region(phase=FORWARD):
            return gather_matmul(x, weights, group, overlap=self.overlap)

    def matmul_enter_backward(self, dys, weights, group: Group) -> np.ndarray:
        """``Σ_i dy_i·W_iᵀ`` and f̄ backward: ``[b, s, n_i]`` -> this rank's ``[b, s/p, k]`` (phase backward)."""
        with group.tracer.region(phase=BACKWARD):
            return matmul_scatter(list(dys), [w.T for w in weights], group, overlap=self.overlap)

    def matmul_leave(self, y: np.ndarray, w: np.ndarray, group: Group) -> np.ndarray:
        """``y·B`` and ḡ: ``[b, s, k/p]`` -> this rank's ``[b, s/p, n]``, summed in rank order (phase forward)."""
        with group.tracer.region(phase=FORWARD):
            return matmul_scatter([y], [w], group, overlap=self.overlap)

    def leave_backward_matmul(self, dz: np.ndarray, w: np.ndarray, group: Group) -> tuple[np.ndarray, np.ndarray]:
        """ḡ backward and ``dz·Bᵀ``: ``dz_r [b, s/p, n]`` -> ``(dz [b, s, n], dy [b, s, k/p])`` (phase backward)."""
        with group.tracer.region(phase=BACKWARD):
            (dy,), dz = gather_matmul(dz, [w.T], group, overlap=self.overlap, keep_gathered=True)
        return dz, dy

    def sequence_length(self, local: int, group: Group) -> int:
        """The whole sequence the partitioned layers see (after f̄), from the s/p positions a rank holds."""
        return local * group.size

    # --- the model's edge: where the embedding's output enters the blocks (``tpsim.models.gpt.Transformer``) ---
    def check_sequence(self, seq_len: int, group: Group) -> None:
        """``ConfigError`` unless the sequence splits evenly over the group (on every rank, before any collective)."""
        check_sequence_length(seq_len, group.size)

    def split_sequence(self, x: np.ndarray, plan: DropoutPlan, group: Group) -> tuple[np.ndarray, DropoutPlan]:
        """Keep this rank's s/p positions, ``[b, s, h] -> [b, s/p, h]`` (no communication), and tell the dropout
        plan which positions they are (masks are keyed by global position)."""
        partition = within(sequence_partition(x.shape[1], group), plan.seq_partition)  # CP: rows already a shard
        return ScatterToSequenceParallelRegion.forward(x, group), replace(plan, seq_partition=partition)

    def split_sequence_backward(self, dx: np.ndarray, group: Group, scope: str) -> np.ndarray:
        """The split's backward: all-gather ``[b, s/p, h] -> [b, s, h]``, traced under ``scope`` (the embedding)."""
        with group.tracer.region(scope=scope):
            return ScatterToSequenceParallelRegion.backward(dx, group)

    def __repr__(self) -> str:
        return "SP_OVERLAP_REGION" if self.overlap else "SP_REGION"


Region = TensorParallelRegion | SequenceParallelRegion
TP_REGION, SP_REGION = TensorParallelRegion(), SequenceParallelRegion()
SP_OVERLAP_REGION = SequenceParallelRegion(overlap=True)  # --tp-comm-overlap


def region_for(sequence_parallel: bool, tp_comm_overlap: bool = False) -> Region:
    """The region a model's layers are built with: the one place the sequence-parallel switch is read.
    ``tp_comm_overlap`` needs ``sequence_parallel`` (``tpsim.config.Parallelism.check`` says why)."""
    if tp_comm_overlap and not sequence_parallel:
        raise ValueError("tp_comm_overlap needs sequence_parallel (tpsim.config.Parallelism.check says why)")
    return (SP_OVERLAP_REGION if tp_comm_overlap else SP_REGION) if sequence_parallel else TP_REGION
