"""The JSON that bench/bench_vs_torch.py writes, and its check (pure: no MPI, no torch).

Schema ``tpsim-bench-vs-torch/1``::

    {"schema": "tpsim-bench-vs-torch/1",
     "command": "mpirun -n 8 python bench/bench_vs_torch.py ...",   # as launched (argv of rank 0)
     "machine": {"hostname", "cpu", "cores", "python", "numpy", "torch", "mpi"},   # cores: this process's affinity
     "settings": {"ranks", "repeats", "warmup", "threads_per_rank", "statistics", "note"},
     "cases": {NAME: {
         "description": str, "shape": {...}, "dtype": "float32" | "float64", "tp": int, "dp": int, "ranks": int,
         "seconds": {"tpsim": STATS, "torch": STATS},      # STATS = {"median", "best", "all": [...]}; a round's
                                                            # time is the slowest rank's
         "gemm": {"flops_per_rank", "seconds_per_rank": STATS,   # one thread running the step's GEMMs alone
                  "rate_flops_per_s" (at the best), "ranks_per_core", "limit_s": {"median", "best"},
                  "concurrent_s": STATS},  # every rank of the case running its GEMMs at once (slowest rank)
         "ratios": {"tpsim/torch": {"median", "best"}, "tpsim/gemm_limit": {...}, "torch/gemm_limit": {...},
                    "tpsim/gemm_concurrent": {...}, "torch/gemm_concurrent": {...}},
         "check": {"max_rel_diff", "tolerance", "ok", "what"}}}}

Ratios divide medians by medians and bests by bests (the GEMM limit has both: it is timed in every round).
"""

from __future__ import annotations

import statistics

SCHEMA = "tpsim-bench-vs-torch/1"
TOP_KEYS = ("schema", "command", "machine", "settings", "cases")
MACHINE_KEYS = ("hostname", "cpu", "cores", "python", "numpy", "torch", "mpi")
SETTINGS_KEYS = ("ranks", "repeats", "warmup", "threads_per_rank", "statistics", "note")
CASE_KEYS = ("description", "shape", "dtype", "tp", "dp", "ranks", "seconds", "gemm", "ratios", "check")
RATIO_KEYS = ("tpsim/torch", "tpsim/gemm_limit", "torch/gemm_limit", "tpsim/gemm_concurrent",
              "torch/gemm_concurrent")


def stats(times: list[float]) -> dict:
    """``{"median", "best", "all"}`` of per-round seconds."""
    if not times:
        raise ValueError("no timings")
    return {"median": float(statistics.median(times)), "best": float(min(times)), "all": [float(t) for t in times]}


def case_ratios(tpsim: dict, torch: dict, references: dict) -> dict:
    """tpsim/torch, then tpsim/R and torch/R for each reference time R (``{name: {"median", "best"}}``), each
    ratio for the medians and for the bests."""
    pairs = [("tpsim", "torch", tpsim, torch)]
    pairs += [(side, name, t, ref) for name, ref in references.items()
              for side, t in (("tpsim", tpsim), ("torch", torch))]
    return {f"{a}/{b}": {k: x[k] / y[k] for k in ("median", "best")} for a, b, x, y in pairs}


def validate(doc: dict) -> list[str]:
    """Every way ``doc`` departs from the schema, as sentences; an empty list means it conforms."""
    problems = [f"missing top-level key {k!r}" for k in TOP_KEYS if k not in doc]
    if problems:
        return problems
    if doc["schema"] != SCHEMA:
        problems.append(f"schema is {doc['schema']!r}, expected {SCHEMA!r}")
    problems += [f"machine lacks {k!r}" for k in MACHINE_KEYS if k not in doc["machine"]]
    problems += [f"settings lacks {k!r}" for k in SETTINGS_KEYS if k not in doc["settings"]]
    for name, case in doc["cases"].items():
        problems += [f"case {name} lacks {k!r}" for k in CASE_KEYS if k not in case]
        if any(k not in case for k in ("seconds", "ratios", "gemm", "check")):
            continue
        for side in ("tpsim", "torch"):
            s = case["seconds"].get(side, {})
            if not {"median", "best", "all"} <= set(s):
                problems.append(f"case {name}: seconds.{side} needs median, best and all")
            elif not (0 < s["best"] <= s["median"]) or min(s["all"]) != s["best"]:
                problems.append(f"case {name}: seconds.{side} best/median/all are inconsistent")
        problems += [f"case {name}: ratios lacks {k!r}" for k in RATIO_KEYS if k not in case["ratios"]]
        limit = case["gemm"].get("limit_s")
        if not isinstance(limit, dict) or not all(isinstance(limit.get(k), float) and limit[k] > 0
                                                  for k in ("median", "best")):
            problems.append(f"case {name}: gemm.limit_s needs median and best, both > 0")
        if not isinstance(case["check"].get("ok"), bool):
            problems.append(f"case {name}: check.ok must be true or false")
    return problems
