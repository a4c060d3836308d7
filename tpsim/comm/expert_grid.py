"""The MoE layers' fold of a stage's ranks (Parallel Folding): ETP × EP × EDP on order ``EXPERT_ORDER``, pure
arithmetic (no MPI); ``tpsim.comm.grid.ProcessGrid`` splits its expert groups from it."""

from __future__ import annotations

from tpsim.errors import ConfigError
from tpsim.rank_grid import RankGrid

EXPERT_ORDER = "etp-ep-edp-pp"  # the MoE layers' fold of the same ranks (Megatron's expert RankGenerator)


def expert_grid(stage: int, pp: int, ep: int, etp: int = 1) -> RankGrid:
    """The ETP × EP × EDP fold of a stage of ``stage`` ranks (pure arithmetic): EDP = stage / (ETP·EP)."""
    if ep < 1 or etp < 1:
        raise ConfigError(f"ep and etp must be >= 1, got ep {ep}, etp {etp}")
    if stage % (ep * etp):
        raise ConfigError(f"ep x etp = {ep} x {etp} does not divide the {stage} ranks of a stage (tp x cp x dp): the "
                          f"MoE layers fold those ranks into etp x ep x expert-dp")
    return RankGrid(EXPERT_ORDER, {"etp": etp, "ep": ep, "edp": stage // (ep * etp), "pp": pp})


def expert_lines(fold: RankGrid) -> str:
    """The MoE layers' fold of the ranks (Parallel Folding) as text: every EP, ETP and expert-DP group."""
    sizes = fold.sizes
    lines = ["", f"Experts fold the same ranks: ETP({sizes['etp']}) x EP({sizes['ep']}) x EDP({sizes['edp']}) per stage "
             f"(order {fold.order}: tokens trade over EP, an expert's columns over ETP, its gradients sum over EDP)"]
    for name in ("ep", "etp", "edp"):
        if sizes[name] > 1:
            lines += [f"  {name.upper()} group {i}: ranks {list(g)}" for i, g in enumerate(fold.groups(name))]
    return "\n".join(lines)
