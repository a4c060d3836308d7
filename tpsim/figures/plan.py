"""The planner's figures (``tpsim plan`` at real sizes; pure arithmetic, no runs):

    plan_memory_by_layout.png   Llama-3-70B on 64 H100s: memory per GPU by component across layouts
    plan_search_frontier.png    the search's best step time and its layout vs the number of GPUs
    plan_tp_placement.png       TP 8 inside a node (NVLink) vs spread over two nodes (InfiniBand), real models
    plan_step.png               where one step goes: NeMo's GPT-3 175B in FP8 on 128 H100s (tpsim.plan.step_figure)

The planner's terms are the ones ``tpsim plan --validate`` checks against live runs; the pipeline's come from the
1F1B schedule on the virtual clock (``tpsim.plan.pipeline``), each layer's time from its kernels on the GPU's
roofline (``tpsim.plan.kernel_time``) and nominal link figures (``tpsim.gpus``).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from tpsim.plan.layout import Layout
from tpsim.plan.models import PRESETS
from tpsim.plan.planner import plan
from tpsim.plan.search import search
from tpsim.plotting import pyplot
from tpsim.figures.style import COLORS, save_figure

BASE = Layout(sp=True, recompute="selective", seq_len=8192, global_batch=256)  # Llama-3-like batch of 2 M tokens
LAYOUTS = [(8, 8, 1, 0), (8, 4, 2, 0), (8, 4, 2, 1), (8, 2, 4, 0), (8, 2, 4, 1), (4, 8, 2, 0), (4, 4, 4, 1)]
COMPONENTS = ("params", "grads", "optimizer", "activations")


def memory_numbers(model: str = "llama3-70b") -> dict[str, dict[str, int]]:
    out = {}
    for tp, pp, dp, zero in LAYOUTS:
        p = plan(PRESETS[model], replace(BASE, tp=tp, pp=pp, dp=dp, zero=zero))
        out[f"TP{tp} PP{pp} DP{dp}" + (" Z1" if zero else "")] = p.per_gpu["memory_bytes"]
    return out


def frontier_numbers(model: str = "llama3-70b", gpus=(32, 64, 128, 256, 512, 1024)) -> dict[int, dict]:
    out = {}
    for n in gpus:
        plans = search(PRESETS[model], BASE, n)
        if plans:
            best = plans[0]
            lay = best.layout
            out[n] = {"step_s": best.time_s["step"], "layout": f"{lay['tp']}x{lay['pp']}x{lay['dp']}",
                      "fits": len(plans)}
    return out


def placement_numbers() -> dict[str, dict[str, dict[str, float]]]:
    cases = {"llama3-8b": (8, 1, 8), "llama3-70b": (8, 4, 2), "gpt3-175b": (8, 8, 1)}
    out = {}
    for name, (tp, pp, dp) in cases.items():
        lay = replace(BASE, tp=tp, pp=pp, dp=dp, seq_len=min(8192, PRESETS[name].positions))
        out[name] = {where: plan(PRESETS[name], replace(lay, gpus_per_node=n)).time_s
                     for where, n in (("TP in one node (NVLink)", 8), ("TP over 2 nodes (InfiniBand)", 4))}
    return out


def plot_memory_by_layout(numbers, path: Path) -> Path:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(10, 4.8))
    names = list(numbers)
    bottom = [0.0] * len(names)
    for key in COMPONENTS:
        gb = [numbers[n][key] / 1e9 for n in names]
        ax.bar(names, gb, bottom=bottom, color=COLORS[key], label=key)
        bottom = [b + g for b, g in zip(bottom, gb)]
    ax.axhline(80, color="black", ls="--", lw=1, label="H100 \"80 GB\", taken as 80·10⁹ B")
    ax.set_ylabel("GB (10⁹ B) per GPU, the stage with the most")
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    return save_figure(fig, path, "Llama-3-70B on 64 H100s: memory per GPU by layout (bf16, SP, selective recompute,"
                                  " 256 x 8192 tokens)",
                       "tpsim plan: Megatron-LM's bytes per parameter (18, or 6 + 12/d with ZeRO-1 'Z1'), activations "
                       "per layer derived for Llama (tpsim's own terms not included) x min(p, m) micro-batches in "
                       "flight (1F1B, Narayanan et al. 2021), fp32 logits on the last stage.")


def plot_frontier(numbers, path: Path) -> Path:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.6))
    gpus = sorted(numbers)
    steps = [numbers[n]["step_s"] for n in gpus]
    ax.plot(gpus, steps, "o-", color=COLORS["tp"])
    for n, s in zip(gpus, steps):
        ax.annotate(numbers[n]["layout"], (n, s), textcoords="offset points", xytext=(4, 6), fontsize=8)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(gpus, [str(n) for n in gpus])
    ax.set_xlabel("GPUs (H100 80 GB, 8 per node)")
    ax.set_ylabel("estimated step time (s), nothing overlapped")
    ax.grid(alpha=0.3, which="both")
    return save_figure(fig, path, "Llama-3-70B: the search's fastest layout (TP x PP x DP) per GPU count",
                       "tpsim plan --search: layouts that fit, ranked by compute at 50% of 989 TFLOP/s + TP, DP, PP "
                       "on nominal NVLink/InfiniBand (alpha-beta) + the 1F1B bubble on the virtual clock (each "
                       "stage's FLOPs, the LM head on the last); 256 sequences of 8192 tokens.")


def plot_placement(numbers, path: Path) -> Path:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(9, 4.8))
    parts = (("compute", "#999999"), ("bubble", "#CCCCCC"), ("tp", COLORS["tp"]), ("dp", COLORS["dp"]),
             ("pp", "#55A868"))
    width = 0.38
    for m, (model, per_place) in enumerate(numbers.items()):
        for j, (place, t) in enumerate(per_place.items()):
            x, bottom = m + (j - 0.5) * width, 0.0
            for key, color in parts:
                ax.bar(x, t[key], width, bottom=bottom, color=color, hatch="" if j == 0 else "//", edgecolor="white",
                       label=key if m == j == 0 else None)
                bottom += t[key]
            ax.text(x, bottom, f"{bottom:.1f} s", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(numbers)), list(numbers))
    ax.set_ylabel("estimated step time (s)")
    ax.legend(fontsize=8, title="plain: TP in a node; hatched: over 2 nodes", title_fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    return save_figure(fig, path, "TP 8 inside a node vs across two nodes (H100, bf16, SP, 256 x 8192 tokens)",
                       "tpsim plan: TP bytes from tpsim.predict.formulas.predict_step on NVLink 4 (450 GB/s a direction)"
                       " or InfiniBand NDR (50 GB/s per GPU); nominal figures, alpha assumed.")


def step_plan():
    """NeMo 24.07's GPT-3 175B row in FP8 on 128 H100s, every knob as the row gives it."""
    from tpsim.plan.published_fp8 import fp8_layout, fp8_model, load_fp8
    row = next(r for r in load_fp8() if r["name"] == "NEMO-GPT3-175B-128")
    return plan(fp8_model(row), fp8_layout(row))


def plot_plan_figures(out: Path) -> tuple[list[Path], dict]:
    from tpsim.plan.step_figure import plot_step, step_parts
    p = step_plan()
    numbers = {"memory_by_layout": memory_numbers(), "frontier": frontier_numbers(),
               "tp_placement": placement_numbers(), "step_parts": dict(step_parts(p))}
    paths = [plot_memory_by_layout(numbers["memory_by_layout"], out / "plan_memory_by_layout.png"),
             plot_frontier(numbers["frontier"], out / "plan_search_frontier.png"),
             plot_placement(numbers["tp_placement"], out / "plan_tp_placement.png"),
             plot_step(p, out / "plan_step.png")]
    return paths, numbers
