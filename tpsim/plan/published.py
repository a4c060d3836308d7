"""Published numbers beside the planner: Narayanan et al. 2021's training runs and the ZeRO paper's 7.5B example.

Narayanan et al. 2021 (arXiv:2104.04473), Table 1 — GPT models of vocabulary 51,200 and sequence 2048 on 80 GB
A100s (DGX A100 nodes of 8, InfiniBand HDR), mixed precision, activation recomputation; the achieved TFLOP/s per
GPU count the recomputation (their 96·B·s·L·h² formula). Two rows: the 145.6 B model (the GPT-3-scale row:
h 12288 as GPT-3 175B, 80 layers) and the 529.6 B one. The table gives no micro-batch size; the planner takes 1.
Both ran the interleaved schedule: Megatron-LM's ``examples/academic_paper_scripts/sc21/run_table_1.sh`` sets
``--num-layers-per-virtual-pipeline-stage`` 5 for the 145.6 B model (80 layers / PP 8 = 10 a rank: v = 2) and
1 for the 529.6 B one (105 / 35 = 3 a rank: v = 3); the planner runs that schedule on its virtual clock.

The planner's prediction uses its defaults — ``--mfu 0.5``, full recompute, ``--dtype fp16``, nothing tuned to
these rows — so the comparison shows what the model leaves out (kernel efficiency that varies with the shapes,
the scatter/gather optimisation, overlap of the DP all-reduce) rather than hiding it.
"""

from __future__ import annotations

from dataclasses import dataclass

from tpsim.plan.layout import Layout
from tpsim.plan.memory import ZERO_PAPER_STATE_BYTES, state_bytes_per_param
from tpsim.plan.models import ModelSpec, gpt
from tpsim.plan.planner import plan
from tpsim.table import RULE, format_table


@dataclass(frozen=True)
class PublishedRun:
    model: ModelSpec
    tp: int
    pp: int
    gpus: int
    batch: int
    tflops_per_gpu: float  # achieved, as published
    vp: int = 1  # model chunks a pipeline rank (interleaved when > 1), as the run's script sets them


NARAYANAN_TABLE_1 = [
    PublishedRun(gpt("145.6B (Narayanan T1)", 51200, 12288, 80, 96, 2048), 8, 8, 1536, 2304, 148.0, vp=2),
    PublishedRun(gpt("529.6B (Narayanan T1)", 51200, 20480, 105, 128, 2048), 8, 35, 2520, 2520, 163.0, vp=3),
]


def predict(run: PublishedRun, mfu: float = 0.5) -> dict:
    lay = Layout(tp=run.tp, pp=run.pp, dp=run.gpus // (run.tp * run.pp), recompute="full", seq_len=2048,
                 micro_batch=1, global_batch=run.batch, dtype="float16", gpu="a100-80gb", mfu=mfu,
                 schedule="interleaved" if run.vp > 1 else "1f1b", vp=run.vp)
    return plan(run.model, lay)


def format_narayanan(mfu: float = 0.5) -> str:
    rows = [["model", "GPUs", "TP x PP x DP", "schedule", "batch", "published TFLOP/s", "planner TFLOP/s", "ratio",
             "memory/GPU", "step"], RULE]
    for r in NARAYANAN_TABLE_1:
        p = predict(r, mfu)
        lay = p["layout"]
        rows.append([r.model.name, f"{r.gpus:,}", f"{lay['tp']} x {lay['pp']} x {lay['dp']}",
                     lay["schedule"] + (f" vp {lay['vp']}" if lay["vp"] > 1 else ""), str(r.batch),
                     f"{r.tflops_per_gpu:.0f}", f"{p['tflops_per_gpu']:.0f}",
                     f"{p['tflops_per_gpu'] / r.tflops_per_gpu:.2f}",
                     f"{p['per_gpu']['memory_bytes']['total'] / 1e9:.1f} GB", f"{p['time_s']['step']:.1f} s"])
    title = f"Narayanan et al. 2021, Table 1, vs tpsim plan (A100 80 GB, fp16, full recompute, micro-batch 1, --mfu {mfu})"
    return format_table(rows, right=(1, 2, *range(4, 10)), title=title)


def zero_paper_example(params: float = 7.5e9, dp: int = 64) -> dict[str, float]:
    """Rajbhandari et al. 2019 (arXiv:1910.02054), §1 / Figure 1: 7.5 B parameters, Nd = 64, mixed-precision
    Adam at 2 + 2 + 12 = 16 bytes a parameter: 120 GB per GPU, 31.4 GB with optimizer-state sharding (P_os)."""
    plain = state_bytes_per_param("float16", 0, dp, table=ZERO_PAPER_STATE_BYTES)["total"]
    sharded = state_bytes_per_param("float16", 1, dp, table=ZERO_PAPER_STATE_BYTES)["total"]
    megatron = state_bytes_per_param("float16", 1, dp)["total"]
    return {"baseline_gb": params * plain / 1e9, "os_sharded_gb": params * sharded / 1e9,
            "megatron_fp16_sharded_gb": params * megatron / 1e9}
