"""Sequence parallelism — the operators ḡ and f̄ of Korthikanti et al. (2022), "Reducing Activation
Recomputation in Large Transformer Models", §4.2.2 and Fig. 5.

Plain TP (``mappings.py``) leaves LayerNorm, dropout and the residual adds *replicated*: every rank holds the
whole [b, s, h] activation of those regions and repeats the same work on it. All three act on each sequence
position independently, so SP splits them along the sequence instead — rank r holds positions
[r·s/p, (r+1)·s/p) — and replaces the pair (f, g) that joins them to the tensor-parallel regions by (f̄, ḡ):

    f̄  = gather from SP region          forward: all-gather along s         backward: reduce-scatter along s
    ḡ  = reduce-scatter to SP region     forward: reduce-scatter along s     backward: all-gather along s
    scatter to SP region                 forward: keep this rank's s/p       backward: all-gather along s

    x [b, s/p, h] --LayerNorm--> --f̄--> [b, s, h] --column ... row--> partial [b, s, h] --ḡ--> [b, s/p, h]
                                                                           --dropout, + residual-->  x [b, s/p, h]

An all-reduce *is* a reduce-scatter followed by an all-gather, so ḡ (this block's half) and the next f̄ (the
other half) move what one g moved: the same wire bytes, (p−1)/p·B each instead of 2(p−1)/p·B for one
all-reduce of B bytes. What SP saves is memory: the activations of the LN/dropout regions are ÷ p.

f̄'s backward is a reduce-scatter, not a split, because the column-parallel layer after it gives every rank a
*partial sum* of the full [b, s, h] input gradient (the job f's all-reduce did); each rank keeps its summed
s/p rows. ḡ's backward is an all-gather: the gradient of a reduce-scatter hands every rank the rows it needs.

Layout: activations here are batch-first **[b, s, h], so the sequence dimension is axis 1** (``SEQ_AXIS``).
Megatron-LM keeps [s, b, h] and splits axis 0; the operators are the same. Each operator is a class with a
static ``forward`` and ``backward`` taking the TP ``Group``, tagged phase ``FORWARD``/``BACKWARD``; the calling
layer supplies the scope. Names follow Megatron (``gather_from_sequence_parallel_region`` ...). Three of the
six directions are the same all-gather along s (f̄ forward, the scatter's and ḡ's backward), so they share
``gather_sequence``; the layers choose between (f, g) and (f̄, ḡ) in ``tpsim.tp.regions``.
"""

from __future__ import annotations

import numpy as np

from tpsim.comm import Group
from tpsim.errors import ConfigError
from tpsim.partition import Partition
from tpsim.phases import BACKWARD, FORWARD

SEQ_AXIS = 1  # [batch, seq, hidden]


def check_sequence_length(seq_len: int, tp: int, what: str = "sequence length") -> None:
    """Raise ``ConfigError`` unless ``seq_len`` splits evenly over ``tp`` (call it before any collective)."""
    if seq_len % tp:
        raise ConfigError(f"{what} {seq_len} is not divisible by tp {tp} (sequence parallelism splits the sequence)")


def sequence_partition(seq_len: int, group: Group) -> Partition:
    """Where this rank's chunk sits in the full sequence: ``Partition(SEQ_AXIS, positions, seq_len)``."""
    check_sequence_length(seq_len, group.size)
    chunk = seq_len // group.size
    return Partition(SEQ_AXIS, np.arange(group.rank * chunk, (group.rank + 1) * chunk), seq_len)


def split_sequence(x: np.ndarray, group: Group) -> np.ndarray:
    """This rank's chunk of the sequence: [b, s, ...] -> [b, s/p, ...], a copy (so the full tensor can go)."""
    index = sequence_partition(x.shape[SEQ_AXIS], group).index
    return np.ascontiguousarray(x[:, index[0]:index[-1] + 1])


def gather_sequence(x: np.ndarray, group: Group, phase: str = BACKWARD) -> np.ndarray:
    """All-gather along the sequence: [b, s/p, h] -> [b, s, h], traced in ``phase``."""
    with group.tracer.region(phase=phase):
        return group.all_gather(x, axis=SEQ_AXIS)


class ScatterToSequenceParallelRegion:
    """Megatron: ``scatter_to_sequence_parallel_region``.
    Entry into SP: forward keeps this rank's s/p positions [b, s, h] -> [b, s/p, h]; backward all-gathers."""

    @staticmethod
    def forward(x: np.ndarray, group: Group) -> np.ndarray:
        return split_sequence(x, group)

    @staticmethod
    def backward(dy: np.ndarray, group: Group) -> np.ndarray:
        return gather_sequence(dy, group, BACKWARD)


class GatherFromSequenceParallelRegion:
    """f̄ (Megatron: ``gather_from_sequence_parallel_region``):
    forward all-gather [b, s/p, h] -> [b, s, h]; backward reduce-scatter the partial sums back to s/p."""

    @staticmethod
    def forward(x: np.ndarray, group: Group) -> np.ndarray:
        return gather_sequence(x, group, FORWARD)

    @staticmethod
    def backward(dy: np.ndarray, group: Group) -> np.ndarray:
        with group.tracer.region(phase=BACKWARD):
            return group.reduce_scatter(dy, axis=SEQ_AXIS)


class ReduceScatterToSequenceParallelRegion:
    """ḡ (Megatron: ``reduce_scatter_to_sequence_parallel_region``):
    forward sum the partials [b, s, h] and keep s/p rows -> [b, s/p, h]; backward all-gather them."""

    @staticmethod
    def forward(x: np.ndarray, group: Group) -> np.ndarray:
        check_sequence_length(x.shape[SEQ_AXIS], group.size)  # a ConfigError, not the collective's ValueError
        with group.tracer.region(phase=FORWARD):
            return group.reduce_scatter(x, axis=SEQ_AXIS)

    @staticmethod
    def backward(dy: np.ndarray, group: Group) -> np.ndarray:
        return gather_sequence(dy, group, BACKWARD)

