"""The auxiliary losses of sequences spread over ranks: ``SequenceStats`` for a rank's share of them.

Under sequence parallelism (tokens cut over TP) and context parallelism (over CP) one sequence's tokens lie on
the TP × CP ranks of a replica, its *sequence group*. The load-balancing loss is per sequence
(``tpsim.nn.router``), so those ranks sum their per-sequence counts and probability sums (one all-reduce of
[B, 2E + 1] per MoE layer and micro-batch, traced) and each holds whole sequences' statistics:

    s     = local positions × group size          a whole sequence's tokens
    value = the replica's (its B sequences'); every rank of the group holds the same
    norm  = T_local · tp · m                      the tokens of this rank's loss: TP ranks share one loss (their
                                                  dense gradients are summed), CP ranks each own theirs; a
                                                  micro-batch's loss weighs 1/m of the step's (m micro-batches)

so that a token's auxiliary gradient is the serial one times dp·cp — the factor by which the data-parallel
average of the gradients divides, as for every other gradient of the rank's loss.
"""

from __future__ import annotations

from tpsim.comm import Group
from tpsim.nn.router import SequenceStats


def sequence_stats(shape: tuple[int, ...], sequence_group: Group, tp: int, microbatches: int = 1) -> SequenceStats:
    """``SequenceStats`` of a rank's tokens ``shape`` [b, s_local, h] whose sequences span ``sequence_group``, in
    one of ``microbatches`` micro-batches of the step."""
    b, s_local = shape[0], shape[1]
    return SequenceStats(b, s_local * sequence_group.size, float(b * s_local * tp * microbatches),
                         reduce=lambda a: sequence_group.all_reduce(a) if sequence_group.size > 1 else a)
