"""Published training runs beside the planner: step time predicted vs published, row by row, in the open.

The development rows (``tpsim/plan/data/published_runs_dev.json``, each naming where its numbers were read):

- Narayanan et al. 2021 (arXiv:2104.04473), Table 1 — all 10 GPT models, 1.7 B to 1008 B parameters, on 80 GB
  A100s (DGX A100, InfiniBand HDR), float16, full recompute; TP, PP, micro-batch and the interleaved schedule's
  chunks as Megatron-LM's ``examples/academic_paper_scripts/sc21/run_table_1.sh`` sets them. The published
  number is TFLOP/s a GPU; the step time is it converted with the paper's own FLOP count,
  96·B·s·L·h²·(1 + s/6h + V/16Lh).
- Korthikanti et al. 2022 (arXiv:2205.05198), Table 5 — 22 B, 175 B, 530 B and 1 T, each with full recompute
  and with selective recompute + sequence parallelism, the iteration time as published (configurations as
  Calculon's ``validation/seqsel/`` transcribes them).

The planner predicts each with its defaults (``Layout``'s: the kernel model of ``tpsim.plan.kernel_time``,
nothing overlapped, as those runs ran) but one, the same for every row: the Megatron-LM of these papers
all-reduced each stage's contiguous gradient buffer in one call (its "local" DDP with contiguous buffers, no
``--overlap-grad-reduce``), so the rows are priced with one DP bucket a stage (``ONE_BUCKET_MB``), as the
planner's default (Megatron's rule) does without the overlap. The same two fitted efficiencies for every row,
nothing per row. The table gives published and predicted seconds, their ratio, the median and worst
|ratio − 1|, and each row's ratio with the efficiencies fitted without its own source's rows (LOFO,
``tpsim.plan.lofo``: what to expect on runs the model was not fitted to).
"""

from __future__ import annotations

import json
import statistics
from dataclasses import replace
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

from tpsim.plan.layout import Layout
from tpsim.plan.lofo import committed
from tpsim.plan.memory import ZERO_PAPER_STATE_BYTES, state_bytes_per_param
from tpsim.plan.models import ModelSpec, gpt
from tpsim.plan.planner import plan
from tpsim.table import RULE, format_table

DEV_ROWS = Path(__file__).with_name("data") / "published_runs_dev.json"
DTYPES = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32"}
ONE_BUCKET_MB = float(2 ** 20)  # a cap no stage's gradients reach: one all-reduce a stage (the module docstring)
SCHEDULE_NAMES = {"interleaved": "intl."}  # the table's narrow column


def load(path: Path = DEV_ROWS) -> list[dict]:
    """The published rows of ``path`` (the module docstring's JSON: ``rows`` of name, source, model, layout,
    published)."""
    return json.loads(Path(path).read_text())["rows"]


def row_model(row: dict) -> ModelSpec:
    m = row["model"]
    return gpt(row["name"], m["vocab"], m["hidden"], m["layers"], m["heads"], m["seq_len"])


def row_layout(row: dict, **changes) -> Layout:
    """The planner's ``Layout`` of a published row (``changes``: any field instead, e.g. the efficiencies)."""
    lay, m = row["layout"], row["model"]
    schedule = "1f1b" if lay["schedule"] == "none" else lay["schedule"]  # one stage: every schedule is F then B
    out = Layout(tp=lay["tp"], pp=lay["pp"], dp=lay["dp"], sp=lay["sp"], recompute=lay["recompute"],
                 seq_len=m["seq_len"], micro_batch=lay["micro_batch"], global_batch=lay["global_batch"],
                 dtype=DTYPES[lay["dtype"]], gpu=lay["gpu"], schedule=schedule, vp=lay["vp"],
                 bucket_mb=ONE_BUCKET_MB)
    return replace(out, **changes)


def compare(rows: list[dict] | None = None, **changes) -> dict:
    """``{"rows": [{"name", "published_s", "predicted_s", "ratio", "plan"}], "median", "worst"}`` (errors as
    |ratio − 1|) for ``rows`` (default: the development rows) under ``changes`` to every layout."""
    out = []
    for row in load() if rows is None else rows:
        p = plan(row_model(row), row_layout(row, **changes))
        want = row["published"]["time_s"]
        out.append({"name": row["name"], "published_s": want, "predicted_s": p.time_s["step"],
                    "ratio": p.time_s["step"] / want, "plan": p, "source": row["source"]})
    errors = [abs(r["ratio"] - 1) for r in out]
    return {"rows": out, "median": statistics.median(errors), "worst": max(errors)}


def format_published(result: dict | None = None) -> str:
    """The comparison as a table (≤ 100 columns), the median and worst error under it; beside each row its
    leave-one-family-out ratio (``tpsim.plan.lofo``: the efficiencies fitted without its source's rows)."""
    result = compare() if result is None else result
    lofo = committed()
    rows = [["run", "GPUs", "TPxPPxDP", "schedule", "mb", "recompute", "published", "planner", "ratio", "LOFO"],
            RULE]
    for r in result["rows"]:
        lay = r["plan"].layout
        sched = "-" if lay["pp"] == 1 else SCHEDULE_NAMES.get(lay["schedule"], lay["schedule"]) + (
            f" vp {lay['vp']}" if lay["vp"] > 1 else "")
        recompute = {"selective": "sel."}.get(lay["recompute"], lay["recompute"]) + (" + SP" if lay["sp"] else "")
        left_out = lofo["ratios"].get(r["name"]) if lofo else None
        rows.append([r["name"], f"{lay['gpus']:,}", f"{lay['tp']}x{lay['pp']}x{lay['dp']}", sched,
                     str(lay["micro_batch"]), recompute, f"{r['published_s']:.2f} s", f"{r['predicted_s']:.2f} s",
                     f"{r['ratio']:.3f}", "-" if left_out is None else f"{left_out:.3f}"])
    title = ("Published step times vs tpsim plan (A100 80 GB, float16)\n"
             "N21 = Narayanan et al. 2021 Table 1, K22 = Korthikanti et al. 2022 Table 5")
    foot = (f"|predicted / published - 1|: median {result['median']:.1%}, worst {result['worst']:.1%} over "
            f"{len(result['rows'])} runs,\none pair of fitted efficiencies for every row (tpsim.plan.kernel_time)")
    if lofo:
        fits = "; ".join(f"{f} at GEMM {p['gemm']:.2f}, HBM {p['hbm']:.2f}" for f, p in lofo["families"].items())
        foot += (f"\nLOFO: each row at the efficiencies fitted without its source's rows,\n{fits}:\n"
                 f"median {lofo['median']:.1%}, worst {lofo['worst']:.1%} (tpsim.plan.lofo)")
    return format_table(rows, right=(1, 2, 4, 6, 7, 8, 9), title=title) + "\n" + foot


def zero_paper_example(params: float = 7.5e9, dp: int = 64) -> dict[str, float]:
    """Rajbhandari et al. 2019 (arXiv:1910.02054), §1 / Figure 1: 7.5 B parameters, Nd = 64, mixed-precision
    Adam at 2 + 2 + 12 = 16 bytes a parameter: 120 GB per GPU, 31.4 GB with optimizer-state sharding (P_os)."""
    plain = state_bytes_per_param("float16", 0, dp, table=ZERO_PAPER_STATE_BYTES)["total"]
    sharded = state_bytes_per_param("float16", 1, dp, table=ZERO_PAPER_STATE_BYTES)["total"]
    megatron = state_bytes_per_param("float16", 1, dp)["total"]
    return {"baseline_gb": params * plain / 1e9, "os_sharded_gb": params * sharded / 1e9,
            "megatron_fp16_sharded_gb": params * megatron / 1e9}


ZERO_STAGE_NAMES = ("baseline", "P_os", "P_os+g", "P_os+g+p")  # the paper's Figure 1 columns, stages 0-3
ZERO_PAPER_GB = (120.0, 31.4, 16.6, 1.9)  # Figure 1's per-device memory, as the paper prints it


def paper_round(x: float) -> float:
    """One decimal, halves up, as the paper rounds 1.875 GB to 1.9 GB (GB = 1e9 bytes)."""
    return float(Decimal(repr(x)).quantize(Decimal("0.1"), rounding=ROUND_HALF_UP))


def zero_stages_example(params: float = 7.5e9, dp: int = 64, dtype: str = "bfloat16") -> list[dict]:
    """Figure 1 of Rajbhandari et al. 2019 stage by stage: per stage its name, the paper's bytes per parameter
    (2 + 2 + K, K = 12, split over Nd = ``dp``: 16, 4 + 12/d, 2 + 14/d, 16/d), GB per GPU for ``params`` and
    rounded as the paper does, and the planner's own bytes for ``dtype`` (bf16: Megatron's 18 = 2 + 4 + 12)."""
    out = []
    for zero, name in enumerate(ZERO_STAGE_NAMES):
        paper = state_bytes_per_param("float16", zero, dp, table=ZERO_PAPER_STATE_BYTES)
        mine = state_bytes_per_param(dtype, zero, dp)
        gb = params * paper["total"] / 1e9
        out.append({"zero": zero, "name": name, "bytes_per_param": paper, "gb": gb, "paper_gb": paper_round(gb),
                    "planner_bytes_per_param": mine, "planner_gb": params * mine["total"] / 1e9})
    return out


def format_zero_example(params: float = 7.5e9, dp: int = 64, dtype: str = "bfloat16") -> str:
    """``tpsim plan --zero-example``: Figure 1's four columns beside the planner's own recipe for ``dtype``."""
    rows = [["ZeRO", "paper's column", "B/param (2+2+K)", "GB / GPU", "as printed", f"{dtype} B/param",
             f"{dtype} GB"], RULE]
    for r in zero_stages_example(params, dp, dtype):
        rows.append([str(r["zero"]), r["name"], f"{r['bytes_per_param']['total']:g}", f"{r['gb']:.4g}",
                     f"{r['paper_gb']:g}", f"{r['planner_bytes_per_param']['total']:g}", f"{r['planner_gb']:.4g}"])
    title = (f"Model state of {params / 1e9:g} B parameters on Nd = {dp} GPUs (Rajbhandari et al. 2019, Figure 1):\n"
             "the paper's mixed-precision Adam (2 + 2 + K, K = 12) beside Megatron's recipe for the dtype")
    return format_table(rows, right=(2, 3, 4, 5, 6), title=title)
