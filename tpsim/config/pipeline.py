"""How a pipeline runs (``Parallelism.pp > 1``): one part of a ``tpsim.config.RunConfig``, checked before any work.

Pure arithmetic, no MPI; ``tpsim.config`` re-exports ``Pipeline``.
"""

from __future__ import annotations

from dataclasses import dataclass

from tpsim.errors import ConfigError, at_least
from tpsim.config import clock_choice  # pure: --clock and --mfu


@dataclass(frozen=True)
class Pipeline:
    """How a pipeline runs (``Parallelism.pp > 1``): the schedule (``tpsim.pipeline.schedules``: afab, 1f1b, ...),
    ``microbatches`` per DP replica per step (the global batch splits into dp × microbatches of them), ``vp`` model
    chunks per rank (``interleaved`` only; chunk c of rank r is virtual stage c·pp + r), the layers of every virtual
    stage (pp × vp sizes in order; None: even). ``clock``, ``mfu``: the virtual clock's (pp 1 too): unit or a GPU."""

    schedule: str = "1f1b"
    microbatches: int = 1
    vp: int = 1
    stage_layers: tuple[int, ...] | None = None
    clock: str = clock_choice.UNIT_CLOCK
    mfu: float | None = None

    def __post_init__(self) -> None:
        at_least(1, microbatches=self.microbatches, vp=self.vp)
        if self.stage_layers is not None:
            object.__setattr__(self, "stage_layers", tuple(int(n) for n in self.stage_layers))
        for name, value in zip(("clock", "mfu"), clock_choice.clock_setting(self.clock, self.mfu)):
            object.__setattr__(self, name, value)

    def check(self, par, layers: int, batch_size: int) -> None:
        """``ConfigError`` (one line) for a pipeline that cannot run: the schedule and its sizes, the layer split,
        a global batch that does not cut into dp × microbatches equal micro-batches. MPI-free."""
        if par.pp == 1:
            if self.microbatches != 1 or self.vp != 1 or self.stage_layers is not None:
                raise ConfigError("--microbatches, --vp and --pp-layers cut a pipeline: they need --pp > 1")
            return  # --clock at pp 1: the one-stage pipeline path (``tpsim.demo.cli``), DP x TP on the clock
        from tpsim.pipeline.check import check  # pure arithmetic, as is the split
        from tpsim.pipeline.schedules import build
        from tpsim.live_pipeline.split import split_layers
        check(build(self.schedule, par.pp, self.microbatches, self.vp))
        split_layers(layers, par.pp * self.vp, self.stage_layers, vp=self.vp)
        if batch_size % (par.dp * self.microbatches):
            raise ConfigError(f"--batch-size {batch_size} does not split into dp x microbatches = {par.dp} x "
                              f"{self.microbatches} equal micro-batches")
