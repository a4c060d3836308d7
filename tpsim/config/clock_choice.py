"""``--clock unit|GPU`` and ``--mfu``: what a live pipeline's virtual clock charges, checked as the configuration
is made (``tpsim.config.Pipeline``). Pure arithmetic, no MPI.

    unit   the textbook's costs: a stage's F 1, B 2, messages free (``tpsim.pipeline.clock.unit``); no --mfu
    GPU    a preset of ``tpsim.gpus`` by its name or the one name it begins (``h100`` → ``h100-80gb``):
           the planner's costs of the run's layout (``tpsim.plan.of_run``): each kernel on the GPU's roofline
           (``tpsim.plan.kernel_time``), or with ``--mfu F`` every matmul at F of the peak
"""

from __future__ import annotations

from tpsim.errors import ConfigError
from tpsim.gpus import GPUS

UNIT_CLOCK = "unit"


def clock_gpu(name: str) -> str:
    """``--clock``'s GPU by its full name: the name itself, or the one preset it begins; ConfigError (one line
    naming the choices) for anything else."""
    found = [g for g in GPUS if g == name] or [g for g in GPUS if g.startswith(f"{name}-")]
    if len(found) != 1:
        what = "names more than one GPU" if found else "is neither unit nor a GPU"
        raise ConfigError(f"--clock {name!r} {what}: choose unit or one of {', '.join(GPUS)}")
    return found[0]


def clock_setting(clock: str, mfu: float | None) -> tuple[str, float | None]:
    """``(clock, mfu)`` as a run holds them: ``("unit", None)`` or ``(GPU's full name, mfu or None)``;
    ConfigError for an unknown clock, an --mfu without a GPU, an --mfu outside (0, 1]."""
    if clock == UNIT_CLOCK:
        if mfu is not None:
            raise ConfigError(f"--mfu {mfu} prices a GPU clock: give --clock GPU too (the unit clock charges F 1, "
                              "B 2 a stage)")
        return clock, None
    if mfu is None:
        return clock_gpu(clock), None  # the planner's kernel model
    mfu = float(mfu)
    if not 0 < mfu <= 1:
        raise ConfigError(f"--mfu {mfu:g}: must be in (0, 1]")
    return clock_gpu(clock), mfu
