"""Leave one family out: how the kernel model's fitted efficiencies carry to runs they were not fitted on.

A table of every development row's predicted / published ratio at every point of the fitting grid
(``tpsim.plan.fit.grid``; committed as ``tpsim/plan/data/fit_grid.json`` by ``python -m tpsim.plan.fit --write``)
is all it takes: the best point on any set of rows is read off it (``best_on``: least worst |ratio − 1|, then
least median), and for each family — a source, the row name's prefix (N21, K22) — the point chosen without its
rows prices them (``leave_one_family_out``). That error is the one to expect on a new family of runs.
The same for the one constant fitted on FP8 rows, ``FP8_GEMM_SPEEDUP`` (``tpsim.plan.fit_fp8`` writes its grid,
``tpsim/plan/data/fit_grid_fp8.json``): the best speed-up on a set of rows (``best_speedup_on``), the committed
choice on NeMo's rows (``fitted_speedup``), and each FP8 family priced at the speed-up fitted on the others
(``fp8_leave_one_family_out``). Pure arithmetic, no MPI.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

GRID_FILE = Path(__file__).with_name("data") / "fit_grid.json"


def family(name: str) -> str:
    """A row's source: its name's prefix (``N21-1.7B`` → ``N21``)."""
    return name.split("-", 1)[0]


def best_on(table: dict, names) -> dict:
    """The grid point of least (worst, median) |ratio − 1| over the rows ``names``: ``{"gemm", "hbm", "worst",
    "median"}``."""
    scored = []
    for i, g in enumerate(table["gemm"]):
        for j, m in enumerate(table["hbm"]):
            errors = [abs(table["ratios"][n][i][j] - 1) for n in names]
            scored.append((max(errors), statistics.median(errors), g, m))
    worst, median, g, m = min(scored)
    return {"gemm": g, "hbm": m, "worst": worst, "median": median}


def leave_one_family_out(table: dict) -> dict:
    """``{"families": {family: best_on(the other rows)}, "ratios": {row: its ratio at its family's point},
    "median", "worst"}``."""
    names = list(table["ratios"])
    families = {family(n) for n in names}
    points = {f: best_on(table, [n for n in names if family(n) != f]) for f in sorted(families)}
    ratios = {}
    for n in names:
        p = points[family(n)]
        ratios[n] = table["ratios"][n][table["gemm"].index(p["gemm"])][table["hbm"].index(p["hbm"])]
    errors = [abs(r - 1) for r in ratios.values()]
    return {"families": points, "ratios": ratios, "median": statistics.median(errors), "worst": max(errors)}


def committed() -> dict | None:
    """The leave-one-family-out result of the committed grid (None before ``--write`` made one)."""
    return leave_one_family_out(json.loads(GRID_FILE.read_text())) if GRID_FILE.exists() else None


# --- the FP8 GEMM speed-up (tpsim.plan.fit_fp8): one number, a family a source of FP8 rows (row["family"]) ---
FP8_GRID_FILE = Path(__file__).with_name("data") / "fit_grid_fp8.json"
FP8_FIT_FAMILY = "NEMO2407"  # the shared development rows; our own rows are never fitted


def best_speedup_on(table: dict, names) -> dict:
    """The speed-up of least (worst, median) |ratio − 1| over the rows ``names``: ``{"speedup", "worst",
    "median"}``."""
    scored = []
    for i, x in enumerate(table["speedup"]):
        errors = [abs(table["ratios"][n][i] - 1) for n in names]
        scored.append((max(errors), statistics.median(errors), x))
    worst, median, x = min(scored)
    return {"speedup": x, "worst": worst, "median": median}


def fitted_speedup(table: dict) -> dict:
    """The committed choice: the best speed-up on the development family's rows."""
    return best_speedup_on(table, [n for n, f in table["family"].items() if f == FP8_FIT_FAMILY])


def fp8_leave_one_family_out(table: dict) -> dict:
    """``{"families": {family: best_on(the other families' rows)}, "ratios": {row: its ratio there}, "median",
    "worst"}``."""
    names = list(table["ratios"])
    families = sorted(set(table["family"].values()))
    points = {f: best_speedup_on(table, [n for n in names if table["family"][n] != f]) for f in families}
    ratios = {n: table["ratios"][n][table["speedup"].index(points[table["family"][n]]["speedup"])] for n in names}
    errors = [abs(r - 1) for r in ratios.values()]
    return {"families": points, "ratios": ratios, "median": statistics.median(errors), "worst": max(errors)}


def fp8_committed() -> dict | None:
    """The leave-one-family-out result of the committed grid (None before ``--write`` made one)."""
    return fp8_leave_one_family_out(json.loads(FP8_GRID_FILE.read_text())) if FP8_GRID_FILE.exists() else None
