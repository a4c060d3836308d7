"""The FP8 rows: NeMo 24.07's pretraining table on DGX-H100 (development), Megatron-Bridge 25.11's (our own).

``tpsim/plan/data/published_runs_dev.json`` holds, beside the 18 rows the two efficiencies were fitted on
(``tpsim.plan.published``), ten rows of NVIDIA NeMo's performance summary (``rows_h100_fp8``: delayed scaling;
each names its source and what the table leaves unstated). ``published_runs_own.json`` adds rows of our own, held
out: Megatron-Bridge 25.11's dense rows on DGX-H100, DGX-B200 and DGX-GB200 (per-tensor current scaling,
``--fp8-recipe current``), each with the table's line quoted. Each row gives its model as a Hugging Face ``config.json`` and every knob of the run in
``tpsim plan``'s own option names (``lay``: tp, pp, dp, cp, vp, seq, micro, batch, dtype, gpu, recompute, sp,
zero, attention, the overlaps, schedule, cp_comm, and where given fp8_recipe and stage_layers); the published
step is global batch · sequence / (tokens a second a GPU · GPUs). The planner predicts each with those knobs and
its defaults; the one constant fitted on FP8 rows, ``FP8_GEMM_SPEEDUP``, was fitted on NeMo's rows only
(``tpsim.plan.fit_fp8``), and the LOFO column prices each family at the speed-up fitted on the other.
Nemotron-4's squared-ReLU MLP, which the shared row gives as a Llama config with the same weights, is planned as
the ``nemotron`` architecture from the row's ``model`` sizes (F = 73,728, two matrices). Pure arithmetic, no MPI.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import replace
from pathlib import Path

from tpsim.plan.layout import Layout
from tpsim.plan.models import ModelSpec, from_hf_dict
from tpsim.plan.planner import plan
from tpsim.plan.published import DEV_ROWS
from tpsim.table import RULE, format_table

OVERLAPS = {"grad": "overlap_grad_reduce", "param": "overlap_param_gather", "tp": "tp_comm_overlap"}


OWN_ROWS = Path(__file__).with_name("data") / "published_runs_own.json"


def load_fp8(path: Path = DEV_ROWS, key: str = "rows_h100_fp8") -> list[dict]:
    """The FP8 rows of ``path`` under ``key``: by default the shared development rows."""
    return json.loads(Path(path).read_text())[key]


def load_own_fp8() -> list[dict]:
    """Our own FP8 rows (``published_runs_own.json``'s ``rows_fp8``): held out, never fitted."""
    return load_fp8(OWN_ROWS, "rows_fp8")


def fp8_model(row: dict) -> ModelSpec:
    """The row's model from its Hugging Face config, read as ``--config`` reads one — but a squared-ReLU MLP
    (``model.ffn_kind``), which the shared rows give as a Llama stand-in, as the ``nemotron`` architecture."""
    if "squared-ReLU" in row.get("model", {}).get("ffn_kind", ""):
        m, cfg = row["model"], row["config"]
        return ModelSpec(row["name"], "nemotron", m["vocab"], m["hidden"], m["layers"], m["heads"], m["kv_heads"],
                         m["ffn"], cfg["max_position_embeddings"], bool(cfg.get("tie_word_embeddings", False)))
    return from_hf_dict(row["config"], row["name"])


def fp8_layout(row: dict) -> Layout:
    """The planner's ``Layout`` of the row's knobs (``lay``), every one as the row names it."""
    k = row["lay"]
    fp8 = k["dtype"] == "fp8"
    return Layout(tp=k["tp"], pp=k["pp"], dp=k["dp"], cp=k["cp"], vp=k["vp"], sp=k["sp"], zero=k["zero"],
                  seq_len=k["seq"], micro_batch=k["micro"], global_batch=k["batch"],
                  dtype="bfloat16" if fp8 else k["dtype"], fp8=fp8, fp8_recipe=k.get("fp8_recipe", "delayed"),
                  stage_layers=k.get("stage_layers"), gpu=k["gpu"], recompute=k["recompute"],
                  attention=k["attention"], schedule="1f1b" if k["schedule"] == "none" else k["schedule"],
                  cp_comm=k["cp_comm"], **{OVERLAPS[o]: True for o in k["overlap"]})


def compare_fp8(rows: list[dict] | None = None, fp8_gemm_speedup: float | None = None) -> dict:
    """``{"rows": [{"name", "gpus", "published_s", "predicted_s", "ratio"}], "median", "worst"}`` for the FP8
    rows (default: the development ones), at ``fp8_gemm_speedup`` (default: the fitted)."""
    out = []
    for row in load_fp8() if rows is None else rows:
        lay = replace(fp8_layout(row), fp8_gemm_speedup=fp8_gemm_speedup)
        if lay.gpus != row["lay"]["gpus"]:
            raise ValueError(f"{row['name']}: tp x cp x pp x dp = {lay.gpus}, the row says {row['lay']['gpus']}")
        step = plan(fp8_model(row), lay).time_s["step"]
        want = row["published"]["time_s"]
        out.append({"name": row["name"], "gpus": lay.gpus, "layout": lay, "published_s": want,
                    "predicted_s": step, "ratio": step / want})
    errors = [abs(r["ratio"] - 1) for r in out]
    return {"rows": out, "median": statistics.median(errors), "worst": max(errors)}


FAMILIES = {"NEMO2407": "NeMo 24.07 on H100, delayed scaling (development rows; the speed-up fitted on them)",
            "MB2511": "Megatron-Bridge 25.11 on H100, B200, GB200, current scaling (our own; never fitted)"}


def format_fp8(dev: dict | None = None, own: dict | None = None) -> str:
    """The FP8 rows as one table (≤ 100 columns): each row's ratio and its leave-one-family-out ratio, then each
    family's median and worst error."""
    from tpsim.plan.lofo import fp8_committed as committed
    from tpsim.plan.kernel_time import FP8_GEMM_SPEEDUP
    dev = compare_fp8() if dev is None else dev
    own = compare_fp8(load_own_fp8()) if own is None else own
    lofo = committed()
    rows = [["run", "GPU", "GPUs", "TPxCPxPPxDP", "vp", "recipe", "published", "planner", "ratio", "LOFO"], RULE]
    for r in dev["rows"] + own["rows"]:
        lay, left_out = r["layout"], lofo["ratios"].get(r["name"]) if lofo else None
        rows.append([r["name"], lay.gpu.split("-")[0], f"{r['gpus']:,}", f"{lay.tp}x{lay.cp}x{lay.pp}x{lay.dp}",
                     str(lay.vp), lay.fp8_recipe, f"{r['published_s']:.2f} s", f"{r['predicted_s']:.2f} s",
                     f"{r['ratio']:.3f}", "-" if left_out is None else f"{left_out:.3f}"])
    title = "FP8 pretraining on DGX systems\n" + "\n".join(f"{k[:-4]} = {v}" for k, v in FAMILIES.items())
    foot = [f"FP8 GEMM speed-up over bf16 {FP8_GEMM_SPEEDUP:.2f} (fitted on NEMO's rows, tpsim.plan.fit_fp8)"]
    for name, res in (("NEMO", dev), ("MB (held out)", own)):
        foot.append(f"{name}: |predicted / published - 1| median {res['median']:.1%}, worst {res['worst']:.1%} "
                    f"over {len(res['rows'])} runs")
    if lofo:
        fits = ", ".join(f"without {f[:-4]} {p['speedup']:.2f}" for f, p in lofo["families"].items())
        foot.append(f"LOFO: each family at the speed-up fitted on the other ({fits}):\n"
                    f"median {lofo['median']:.1%}, worst {lofo['worst']:.1%} (tpsim.plan.fit_fp8)")
    return format_table(rows, right=(2, 4, 6, 7, 8, 9), title=title) + "\n" + "\n".join(foot)


def development_summary() -> str:
    """The development rows as the issue's bounds read them: all of them (the 18 and NeMo's 10) by median and
    worst, and every family left out of its own fit."""
    from tpsim.plan.lofo import fp8_committed as fp8_lofo
    from tpsim.plan.lofo import committed as pair_lofo
    from tpsim.plan.published import compare
    ratios = [r["ratio"] for r in compare()["rows"] + compare_fp8()["rows"]]
    errors = [abs(x - 1) for x in ratios]
    line = (f"all {len(errors)} development rows: median {statistics.median(errors):.1%}, worst {max(errors):.1%}\n"
            "three fitted constants: the GEMM and HBM efficiencies, the FP8 GEMM speed-up")
    pair, fp8 = pair_lofo(), fp8_lofo()
    if pair and fp8:
        dev_fp8 = [n for n in fp8["ratios"] if n.startswith("NEMO-")]
        left = [abs(x - 1) for x in [*pair["ratios"].values(), *(fp8["ratios"][n] for n in dev_fp8)]]
        line += (f"\nleave one family out over those {len(left)} rows (N21, K22, NEMO): median "
                 f"{statistics.median(left):.1%}, worst {max(left):.1%}")
    return line
