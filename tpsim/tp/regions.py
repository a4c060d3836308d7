"""Entering and leaving the tensor-parallel region: f or f̄ in, g or ḡ out, chosen by one flag.

A column-parallel layer (the LM head included) is where an activation *enters* a partitioned computation; a
row-parallel layer is where partial results *leave* it. Plain TP joins them to the replicated regions with
the conjugate pair of Shoeybi et al. 2019 (Megatron-LM, §3 and Fig. 3); sequence parallelism (Korthikanti et
al. 2022, §4.2.2) keeps the replicated regions split along the sequence and swaps in their sequence twins:

                        enter (column-parallel input)           leave (row-parallel output)
    plain TP            f  = identity  | all-reduce               g  = all-reduce      | identity
    sequence-parallel   f̄  = all-gather s | reduce-scatter s       ḡ  = reduce-scatter s | all-gather s
                        (forward | backward)

A layer that enters the region needs its whole input again in the backward (for ``dW = xᵀ·dy``). Under f it
kept that input; under f̄ it keeps only the [b, s/p, h] shard it was given — keeping f̄'s gathered output would
undo the memory SP saves — and ``regather_input`` all-gathers it once more, as Megatron does.
"""

from __future__ import annotations

import numpy as np

from tpsim.comm import Group
from tpsim.phases import BACKWARD
from tpsim.tp.mappings import CopyToTPRegion, ReduceFromTPRegion
from tpsim.tp.sequence_parallel import (GatherFromSequenceParallelRegion, ReduceScatterToSequenceParallelRegion,
                                        gather_sequence)


def _enter(sequence_parallel: bool):
    return GatherFromSequenceParallelRegion if sequence_parallel else CopyToTPRegion


def _leave(sequence_parallel: bool):
    return ReduceScatterToSequenceParallelRegion if sequence_parallel else ReduceFromTPRegion


def enter_tp_region(x: np.ndarray, group: Group, sequence_parallel: bool) -> np.ndarray:
    """f: ``x [..., h]`` replicated, returned as is; f̄: ``x_r [b, s/p, h]`` all-gathered to ``[b, s, h]``."""
    return _enter(sequence_parallel).forward(x, group)


def enter_tp_region_backward(dx: np.ndarray, group: Group, sequence_parallel: bool, *,
                             inplace: bool = False) -> np.ndarray:
    """f: all-reduce the partial input gradient ``[..., h]``; f̄: reduce-scatter it to ``[b, s/p, h]``.

    ``inplace``: ``dx`` is the caller's own fresh buffer, and f's all-reduce may sum into it (no second buffer)."""
    if sequence_parallel:
        return GatherFromSequenceParallelRegion.backward(dx, group)
    return CopyToTPRegion.backward(dx, group, inplace=inplace)


def regather_input(saved: np.ndarray, group: Group, sequence_parallel: bool) -> np.ndarray:
    """The layer's whole input again, in the backward, from what its cache kept (the input itself under f)."""
    return gather_sequence(saved, group, BACKWARD) if sequence_parallel else saved


def leave_tp_region(partial: np.ndarray, group: Group, sequence_parallel: bool, *,
                    inplace: bool = False) -> np.ndarray:
    """g: all-reduce the partial sums ``[..., h]``; ḡ: reduce-scatter them to this rank's ``[b, s/p, h]``.

    ``inplace``: ``partial`` is the caller's own fresh buffer, and g's all-reduce may sum into it."""
    if sequence_parallel:
        return ReduceScatterToSequenceParallelRegion.forward(partial, group)
    return ReduceFromTPRegion.forward(partial, group, inplace=inplace)


def leave_tp_region_backward(dz: np.ndarray, group: Group, sequence_parallel: bool) -> np.ndarray:
    """g: ``dz [..., h]`` as is (every term of a sum gets the same gradient); ḡ: all-gather ``[b, s/p, h]``."""
    return _leave(sequence_parallel).backward(dz, group)
