"""How ``tpsim.plan.kernel_time``'s two efficiencies were chosen: a grid over (GEMM, HBM) on the development
rows of ``tpsim.plan.published`` only, minimising the worst |predicted / published − 1|, then the median.

    python -m tpsim.plan.fit            the grid's best point beside the committed constants (~1 min)

The grid: GEMM efficiency 0.60 to 0.90 and HBM efficiency 0.50 to 1.00, both in steps of 0.05 (coarse on
purpose: two digits is all 18 rows can say). Nothing is fitted per row. Pure arithmetic, no MPI.
"""

from __future__ import annotations

import sys

import numpy as np

from tpsim.plan.kernel_time import GEMM_EFFICIENCY, HBM_EFFICIENCY
from tpsim.plan.published import compare, load

GEMM_GRID = tuple(round(x, 2) for x in np.arange(0.60, 0.9001, 0.05))
HBM_GRID = tuple(round(x, 2) for x in np.arange(0.50, 1.0001, 0.05))


def score(gemm: float, hbm: float, rows=None) -> tuple[float, float]:
    """(worst, median) |ratio − 1| of the rows at these efficiencies."""
    r = compare(rows, gemm_efficiency=gemm, hbm_efficiency=hbm)
    return r["worst"], r["median"]


def best(rows=None, gemm_grid=GEMM_GRID, hbm_grid=HBM_GRID) -> dict:
    """The grid point of least (worst, median) error: ``{"gemm", "hbm", "worst", "median"}``."""
    rows = load() if rows is None else rows
    scored = [(score(g, m, rows), g, m) for g in gemm_grid for m in hbm_grid]
    (worst, median), g, m = min(scored)
    return {"gemm": g, "hbm": m, "worst": worst, "median": median}


def main() -> int:
    b = best()
    print(f"best on the grid: GEMM {b['gemm']:.2f}, HBM {b['hbm']:.2f}: worst {b['worst']:.1%}, "
          f"median {b['median']:.1%}")
    print(f"committed:        GEMM {GEMM_EFFICIENCY:.2f}, HBM {HBM_EFFICIENCY:.2f}")
    return 0 if (b["gemm"], b["hbm"]) == (GEMM_EFFICIENCY, HBM_EFFICIENCY) else 1


if __name__ == "__main__":
    sys.exit(main())
