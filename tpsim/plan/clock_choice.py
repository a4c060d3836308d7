"""``--clock unit|GPU`` and ``--mfu``: what a live pipeline's virtual clock charges, checked as the configuration
is made (``tpsim.config.Pipeline``). Pure arithmetic, no MPI.

    unit   the textbook's costs: a stage's F 1, B 2, messages free (``tpsim.pipeline.clock.unit``); no --mfu
    GPU    a preset of ``tpsim.plan.gpus`` by its name or the one name it begins (``h100`` → ``h100-80gb``):
           the planner's costs of the run's layout at ``--mfu`` (default the planner's 0.5), ``tpsim.plan.of_run``
"""

from __future__ import annotations

from tpsim.errors import ConfigError
from tpsim.plan.gpus import GPUS

UNIT_CLOCK = "unit"
DEFAULT_MFU = 0.5  # the planner's default efficiency of the matmuls (tpsim.plan.layout.Layout.mfu)


def clock_gpu(name: str) -> str:
    """``--clock``'s GPU by its full name: the name itself, or the one preset it begins; ConfigError (one line
    naming the choices) for anything else."""
    found = [g for g in GPUS if g == name] or [g for g in GPUS if g.startswith(f"{name}-")]
    if len(found) != 1:
        what = "names more than one GPU" if found else "is neither unit nor a GPU"
        raise ConfigError(f"--clock {name!r} {what}: choose unit or one of {', '.join(GPUS)}")
    return found[0]


def clock_setting(clock: str, mfu: float | None) -> tuple[str, float | None]:
    """``(clock, mfu)`` as a run holds them: ``("unit", None)`` or ``(GPU's full name, mfu or 0.5)``;
    ConfigError for an unknown clock, an --mfu without a GPU, an --mfu outside (0, 1]."""
    if clock == UNIT_CLOCK:
        if mfu is not None:
            raise ConfigError(f"--mfu {mfu} prices a GPU clock: give --clock GPU too (the unit clock charges F 1, "
                              "B 2 a stage)")
        return clock, None
    mfu = DEFAULT_MFU if mfu is None else float(mfu)
    if not 0 < mfu <= 1:
        raise ConfigError(f"--mfu {mfu:g}: must be in (0, 1]")
    return clock_gpu(clock), mfu
