"""ZeRO's stage as data: what is sharded, when the gradients are reduced, when the parameters are gathered.

ZeRO (Rajbhandari et al. 2019, arXiv:1910.02054, §5 and Figure 1) partitions a model's state over the d ranks
that average its gradients (``dp × cp``), one more kind of state a stage:

    stage 0  plain data parallelism: every rank holds the parameters, the gradients and the optimizer state,
             and all-reduces the gradients once, after the last micro-batch
    stage 1  P_os: each rank keeps the optimizer state of its 1/d slice only (Megatron's distributed optimizer):
             the gradients are reduce-scattered once after the last micro-batch, the rank steps its slice, and
             the updated slices are all-gathered after the step
    stage 2  P_os+g: the gradients too: each bucket is reduce-scattered into the owned slice as the backward
             finishes it, every micro-batch, and freed; the step and its all-gather are stage 1's
    stage 3  P_os+g+p: the parameters too: one bucket a unit (a layer, the embedding, the head), all-gathered
             around the unit's forward and again around its backward and freed after use; nothing is gathered
             after the step, since each rank steps the slice it keeps

The stage is chosen once (``Parallelism.zero_stage``: the run's, the plan's) and the code asks this object what
the stage does (``stage.shards_params``, ``stage.reduces_every_microbatch``) instead of comparing its number;
the number is for printing (``ZeRO-2``) and for the command line's choices. Megatron's two overlaps apply where
there is something to overlap: ``--overlap-grad-reduce`` to a reduction after the backward (stages 0 and 1:
2 and 3 reduce inside it already), ``--overlap-param-gather`` to a gather after the step (stages 1 and 2).
MPI-free, on the ground floor: the run configuration, the predictions, the planner and training read it.
"""

from __future__ import annotations

from dataclasses import dataclass

from tpsim.errors import ConfigError


@dataclass(frozen=True)
class ZeroStage:
    """One ZeRO stage (module docstring): what a rank shards and when the stage's collectives run."""

    stage: int  # 0 (plain DP) to 3: printed as ZeRO-{stage}, the --zero choice
    shards_optimizer: bool  # P_os: the optimizer state (and so the step) cut into owned slices
    shards_grads: bool  # P_os+g: only the owned slices of the gradients are kept
    shards_params: bool  # P_os+g+p: only the owned slices of the parameters are kept
    reduces_every_microbatch: bool  # the gradients reduce-scattered bucket by bucket inside every backward
    gathers_after_step: bool  # the updated parameter slices all-gathered after the optimizer step
    gathers_around_units: bool  # each unit's parameters all-gathered around its forward and its backward
    buckets_at_units: bool  # one gradient bucket a unit, instead of buckets cut by size (--bucket-mb)

    @property
    def grad_collective(self) -> str:
        """The collective that averages a gradient bucket: the all-reduce, or the reduce-scatter into owned
        slices once the optimizer state is sharded."""
        return "reduce_scatter" if self.shards_optimizer else "all_reduce"

    @property
    def overlap_grad_reduce_applies(self) -> bool:
        """``--overlap-grad-reduce`` hides a reduction that waits for the backward's end (stages 0 and 1)."""
        return not self.reduces_every_microbatch

    @property
    def overlap_param_gather_applies(self) -> bool:
        """``--overlap-param-gather`` hides the all-gather after the step under the next forward (stages 1, 2)."""
        return self.gathers_after_step


ZERO_STAGES: dict[int, ZeroStage] = {
    0: ZeroStage(0, shards_optimizer=False, shards_grads=False, shards_params=False, reduces_every_microbatch=False,
                 gathers_after_step=False, gathers_around_units=False, buckets_at_units=False),
    1: ZeroStage(1, shards_optimizer=True, shards_grads=False, shards_params=False, reduces_every_microbatch=False,
                 gathers_after_step=True, gathers_around_units=False, buckets_at_units=False),
    2: ZeroStage(2, shards_optimizer=True, shards_grads=True, shards_params=False, reduces_every_microbatch=True,
                 gathers_after_step=True, gathers_around_units=False, buckets_at_units=False),
    3: ZeroStage(3, shards_optimizer=True, shards_grads=True, shards_params=True, reduces_every_microbatch=True,
                 gathers_after_step=False, gathers_around_units=True, buckets_at_units=True),
}


def zero_stage(n: int) -> ZeroStage:
    """The ZeRO stage ``n`` (0–3) as data; ``ConfigError`` naming the stages for any other ``n``."""
    if isinstance(n, bool) or n not in ZERO_STAGES:
        raise ConfigError(f"--zero {n}: the ZeRO stages here are {', '.join(map(str, ZERO_STAGES))}")
    return ZERO_STAGES[n]
