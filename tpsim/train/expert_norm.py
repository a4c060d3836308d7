"""The gradient norm that counts every parameter once under Parallel Folding.

An expert's parameters live on one (EP, ETP) position of the expert grid and are replicated over expert-DP;
the dense ones live on one (TP, PP) position and are replicated over DP × CP. So the serial model's norm is two
sums, each over the group that holds one copy of every piece (Megatron-Core reduces its expert norm apart the
same way):

    ‖g‖² = Σ_{model-parallel group: TP × PP} dense²  +  Σ_{expert group × PP: EP × ETP × PP} experts²

a TP-replicated dense gradient counted by TP rank 0 only (``tpsim.train.clip``), an expert's ETP shards each by
its holder. Without experts this is the one all-reduce of ``tpsim.train.clip.grad_norm``.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from tpsim.phases import OPTIMIZER
from tpsim.train.clip import GradEntry, check_norm_type, local_contribution

if TYPE_CHECKING:
    from tpsim.comm import ProcessGrid


def folded_grad_norm(entries: list[GradEntry], experts: frozenset[str], grid: ProcessGrid,
                     norm_type: float = 2.0) -> float:
    """The serial model's gradient norm from this rank's ``entries``, the ``experts`` among them summed over the
    expert groups (module docstring): two all-reduces, scope ``clip_grad_norm``."""
    p = check_norm_type(norm_type)
    dense = local_contribution([e for e in entries if e[0] not in experts], p, grid.tp_rank == 0)
    mine = local_contribution([e for e in entries if e[0] in experts], p, True)
    op = "max" if math.isinf(p) else "sum"
    with grid.tracer.region(scope="clip_grad_norm", phase=OPTIMIZER):
        d = float(grid.model_parallel_group.all_reduce(np.array([dense]), op=op)[0])
        e = float(grid.group("ep", "etp", "pp").all_reduce(np.array([mine]), op=op)[0])
    return max(d, e) if math.isinf(p) else (d + e) ** (1.0 / p)
