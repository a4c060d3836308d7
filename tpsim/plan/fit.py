"""How ``tpsim.plan.kernel_time``'s two efficiencies were chosen, and how well the choice carries to runs it was
not chosen on: a grid over (GEMM, HBM) on the development rows of ``tpsim.plan.published`` only, minimising the
worst |predicted / published − 1|, then the median; and the same choice made without each source's rows, to
predict them (leave one family out).

    python -m tpsim.plan.fit            the grid's best point beside the committed constants, and the
                                        leave-one-family-out errors (~1 min)
    python -m tpsim.plan.fit --write    also write the grid's ratios to tpsim/plan/data/fit_grid.json, which
                                        ``tpsim plan --published`` reads for its leave-one-family-out column

The grid: GEMM efficiency 0.60 to 0.90 and HBM efficiency 0.50 to 1.00, both in steps of 0.05 (coarse on
purpose: two digits is all 18 rows can say). Every row is planned once at every point (``grid``); the best point
on any set of rows is then read off that table (``best_on``). A family is a source (the row name's prefix: N21,
K22): leaving it out, the best point on the other rows prices it (``leave_one_family_out``), which is the error
to expect on runs the model was not fitted to. Nothing is fitted per row. Pure arithmetic, no MPI.
"""

from __future__ import annotations

import json
import sys

import numpy as np

from tpsim.atomic import write_text
from tpsim.plan.kernel_time import GEMM_EFFICIENCY, HBM_EFFICIENCY
from tpsim.plan.lofo import GRID_FILE, best_on, leave_one_family_out
from tpsim.plan.published import compare, load

GEMM_GRID = tuple(round(x, 2) for x in np.arange(0.60, 0.9001, 0.05))
HBM_GRID = tuple(round(x, 2) for x in np.arange(0.50, 1.0001, 0.05))


def grid(rows=None, gemm_grid=GEMM_GRID, hbm_grid=HBM_GRID) -> dict:
    """``{"gemm", "hbm", "ratios": {row name: [[predicted / published at (gemm, hbm)] for each gemm]}}``."""
    rows = load() if rows is None else rows
    ratios: dict[str, list[list[float]]] = {r["name"]: [] for r in rows}
    for g in gemm_grid:
        for name in ratios:
            ratios[name].append([])
        for m in hbm_grid:
            for r in compare(rows, gemm_efficiency=g, hbm_efficiency=m)["rows"]:
                ratios[r["name"]][-1].append(r["ratio"])
    return {"gemm": list(gemm_grid), "hbm": list(hbm_grid), "ratios": ratios}


def best(rows=None, gemm_grid=GEMM_GRID, hbm_grid=HBM_GRID) -> dict:
    """The grid point of least (worst, median) error on ``rows`` (default: every development row)."""
    table = grid(rows, gemm_grid, hbm_grid)
    return best_on(table, list(table["ratios"]))


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    table = grid()
    b, out = best_on(table, list(table["ratios"])), leave_one_family_out(table)
    print(f"best on the grid: GEMM {b['gemm']:.2f}, HBM {b['hbm']:.2f}: worst {b['worst']:.1%}, "
          f"median {b['median']:.1%}")
    print(f"committed:        GEMM {GEMM_EFFICIENCY:.2f}, HBM {HBM_EFFICIENCY:.2f}")
    for f, p in out["families"].items():
        print(f"without {f}: GEMM {p['gemm']:.2f}, HBM {p['hbm']:.2f}")
    print(f"leave one family out: median {out['median']:.1%}, worst {out['worst']:.1%}")
    if "--write" in argv:
        write_text(GRID_FILE, json.dumps(table, indent=0) + "\n")
        print(f"wrote {GRID_FILE}")
    return 0 if (b["gemm"], b["hbm"]) == (GEMM_EFFICIENCY, HBM_EFFICIENCY) else 1


if __name__ == "__main__":
    sys.exit(main())
