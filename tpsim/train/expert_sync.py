"""The data-parallel gradient sync of a model with experts (Parallel Folding): two groups, one bucket list.

Dense gradients are averaged over DP × CP as ``GradSync`` does. An expert's gradient is summed over its
expert-DP group — the ranks holding the same expert shard — and divided by dp·cp, not by the expert-DP size
(Megatron-Core's ``expert_gradient_scaling_factor``): each of the dp·cp replicas' losses weighed the tokens it
sent to the expert, so the sum over the ranks that ran the expert counts every replica once, and the mean over
replicas divides by their number.

    dense bucket    all_reduce over "dp" (DP × CP), ÷ dp·cp          scope ddp.bucket{i}
    expert bucket   all_reduce over "edp" (expert-DP),  ÷ dp·cp      scope ddp.bucket{i}

Buckets never mix the two: ``assign_buckets`` closes a bucket where the kind changes, as it does where the dtype
does. Everything else — gradient views, the overlap with the backward, the held buckets — is ``GradSync``'s.
"""

from __future__ import annotations

import numpy as np

from tpsim.comm import ProcessGrid
from tpsim.nn.module import Module
from tpsim.partition import assign_buckets
from tpsim.phases import DP_SYNC
from tpsim.train.ddp import DEFAULT_BUCKET_CAP_BYTES, GradSync, Reduction


class FoldedGradSync(GradSync):
    """``GradSync`` whose buckets of ``experts`` (parameter names) reduce over the expert-DP group."""

    def __init__(self, module: Module, grid: ProcessGrid, experts: frozenset[str],
                 bucket_cap_bytes: int | None = DEFAULT_BUCKET_CAP_BYTES, *, overlap: bool = False,
                 held: tuple[np.ndarray, ...] = ()) -> None:
        self.experts, self.edp_group, self.replicas = experts, grid.group("edp"), grid.replicas
        grads = dict(module.named_grads())

        def cut(names: list[str]) -> list[list[int]]:
            kinds = [(n, grads[n].nbytes, f"{grads[n].dtype}{' expert' if n in experts else ''}") for n in names]
            return assign_buckets(kinds, bucket_cap_bytes)

        super().__init__(module, grid.dp_group, bucket_cap_bytes, overlap=overlap, held=held, groups=cut,
                         reduction=Reduction(self._launch, self._finish))

    @property
    def dp(self) -> int:
        """The larger of the two groups: a sync is needed when either has more than one rank."""
        return max(self.dp_group.size, self.edp_group.size)

    def _group_of(self, i: int):
        return self.edp_group if self.buckets[i].names[0] in self.experts else self.dp_group

    def _launch(self, i: int) -> None:
        group = self._group_of(i)
        if group.size == 1:  # nothing to sum (expert-DP 1: every rank holds its own experts); ÷ replicas still
            self._pending[i], self.bucket_events[i] = None, None
            return
        with group.tracer.region(scope=f"ddp.bucket{i}", phase=DP_SYNC):
            self._pending[i] = group.iall_reduce(self.buffers[i], op="sum", overlap=self.overlap)
        self.bucket_events[i] = self._pending[i].event

    def _finish(self, i: int) -> None:
        pending = self._pending.pop(i)
        if pending is not None:
            pending.wait()
        if self.replicas > 1:
            self.buffers[i] /= self.replicas

    def describe(self) -> str:
        return super().describe().replace("DDP gradient sync", "DDP gradient sync (expert buckets over EDP("
                                          f"{self.edp_group.size}), divided by {self.replicas})")
