"""Exposed vs hidden DP communication per rank, from a run's ``pipeline.json`` — ``tpsim report DIR --exposed``.

A run on a GPU virtual clock (``--clock GPU``, any ``--pp``) at dp > 1 writes, per rank, its DP gradient
buckets' time on the comm stream (``tpsim.pipeline.overlap``): ``comm_s`` their α-β seconds, ``exposed_s`` the
compute stream's wait for them before the optimizer, ``hidden_s`` the rest (under ``--overlap-grad-reduce``,
the part that ran beside the last backward; without it, none), and under ZeRO-1 the exposed part of the
parameter all-gather (``--overlap-param-gather``: the forward's waits for it; without: all of it); under ZeRO-3
its per-piece all-gathers' and reduce-scatters' exposed seconds (``sharded_table``). Modelled
seconds, not this machine's wall clock: on a CPU, MPICH advances a non-blocking collective only inside MPI calls.
No MPI.
"""

from __future__ import annotations

import json
from pathlib import Path

from tpsim.table import RULE, format_table

PIPELINE_JSON = "pipeline.json"


def modelled(x: float) -> str:
    """Modelled seconds in a readable unit."""
    for unit, scale in (("s", 1), ("ms", 1e-3), ("µs", 1e-6)):
        if abs(x) >= scale:
            return f"{x / scale:.4g} {unit}"
    return f"{x * 1e9:.4g} ns"


def read_dp(folder: str | Path) -> dict | None:
    """``pipeline.json``'s ``dp`` part (None: the file or the part is not there — no GPU clock, or dp 1)."""
    path = Path(folder) / PIPELINE_JSON
    if not path.exists():
        return None
    return json.loads(path.read_text()).get("dp")


def exposed_table(dp: dict, title: str = "") -> str:
    """One row per rank: stage, buckets, DP communication, exposed, hidden and the hidden share (≤ 100 columns)."""
    if dp.get("zero") == 3:
        return sharded_table(dp, title)
    gather = dp.get("planner_param_gather") is not None  # ZeRO-1: the all-gather's exposed part as well
    rows = [["rank", "stage", "buckets", "DP comm", "exposed", "hidden", "hidden %"]
            + (["all-gather exposed"] if gather else []), RULE]
    for r in sorted(dp["ranks"], key=lambda r: r["rank"]):
        if "comm_s" not in r:
            rows.append([str(r["rank"]), str(r["stage"]), *["-"] * (5 + gather)])
            continue
        share = r["hidden_s"] / r["comm_s"] if r["comm_s"] else 0.0
        rows.append([str(r["rank"]), str(r["stage"]), str(len(r["buckets"])), modelled(r["comm_s"]),
                     modelled(r["exposed_s"]), modelled(r["hidden_s"]), f"{share:.0%}"]
                    + ([modelled(r["param_gather_exposed_s"])] if gather else []))
    mode = "--overlap-grad-reduce" if dp.get("overlap_grad_reduce") else "no overlap: all after the backward"
    return format_table(rows, title=(f"{title}\n" if title else "") + f"DP gradient buckets on the virtual clock "
                                                                       f"({mode}), modelled seconds:")


def sharded_table(dp: dict, title: str = "") -> str:
    """ZeRO-3 (``--zero 3``): one row per rank, the seconds its all-gathers and reduce-scatters inside F, B and W
    added beyond the pieces' compute (``tpsim.pipeline.prefetch``), the planner's for its stage beside it."""
    rows = [["rank", "stage", "ZeRO-3 collectives", "exposed", "planner's"], RULE]
    for r in sorted(dp["ranks"], key=lambda r: r["rank"]):
        rows.append([str(r["rank"]), str(r["stage"]), str(r["spans"]), modelled(r["sharded_exposed_s"]),
                     modelled(dp["planner_exposed_s"][r["stage"]])])
    return format_table(rows, title=(f"{title}\n" if title else "") + "ZeRO-3's all-gathers (one piece ahead) and "
                                                                       "reduce-scatters inside each action, modelled "
                                                                       "seconds:")
