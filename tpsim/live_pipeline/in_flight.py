"""What a pipeline rank holds between a micro-batch's forward and its release: its layers' activations, in bytes.

Korthikanti et al. 2022 (Table 2) count what one transformer layer keeps for its backward, per micro-batch; a
pipeline rank keeps that for every (micro-batch, chunk) pair in flight, from the pair's F until the backward
that frees it — its B, or for a split backward its W (Qi et al. 2023 count a micro-batch's memory as freed by W;
between B and W the live chunk keeps W's inputs only, so the split schedules' figure is the schedule's bound).
So the peak a rank holds is the schedule's peak of pairs in flight, each pair weighing its chunk's layers ×
one layer's bytes: ``tpsim.plan.memory.activation_peaks``, which the planner prices and ``tpsim plan --validate``
compares with this count on live ranks.

Counted here: every float and bool array of the chunk's blocks' caches (``tpsim.nn.cache_bytes``), each buffer
once — the layer's own activations and dropout masks, as ``--validate``'s per-layer term counts them. The first
stage's embedding caches and the last stage's logits are not a layer's and are left out (the planner adds the
logits on its own). MPI-free.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tpsim.nn.cache_bytes import measure_activations


def layer_bytes(blocks_cache) -> int:
    """Bytes of activations and masks the blocks' caches of one (micro-batch, chunk) pair hold."""
    measured = measure_activations(blocks_cache)
    return measured["activations"] + measured["masks"]


@dataclass
class InFlight:
    """The pairs this rank holds now (``(micro-batch, chunk) -> bytes``) and the peaks of their count and bytes."""

    pairs: dict[tuple[int, int], int] = field(default_factory=dict)
    peak_pairs: int = 0
    peak_bytes: int = 0

    def take(self, key: tuple[int, int], blocks_cache) -> None:
        """The F of ``key`` ran and left ``blocks_cache``."""
        self.pairs[key] = layer_bytes(blocks_cache)
        self.peak_pairs = max(self.peak_pairs, len(self.pairs))
        self.peak_bytes = max(self.peak_bytes, sum(self.pairs.values()))

    def free(self, key: tuple[int, int]) -> None:
        """The backward that releases ``key`` (B, or W for a split backward) ran."""
        del self.pairs[key]
