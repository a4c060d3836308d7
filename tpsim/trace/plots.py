"""Figures of a run: the loss curve and the collective bytes per layer (stacked by op, split by phase).

matplotlib is imported inside each function, on the rank that plots (importing pyplot on 8 ranks costs
seconds at start-up), with the Agg backend: no screen needed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from tpsim.phases import PASSES
from tpsim.plotting import pyplot
from tpsim.trace.aggregate import layer_of
from tpsim.atomic import save_figure

OP_COLORS = {"all_reduce": "#4C72B0", "all_gather": "#55A868", "reduce_scatter": "#C44E52",
             "broadcast": "#8172B2", "gather": "#CCB974", "barrier": "#999999", "all_to_all": "#DD8452",
             "all_to_all_v": "#E377C2", "all_gather_v": "#8CD17D", "reduce_scatter_v": "#FF9D9A"}


def plot_loss(steps: Sequence[int], losses: Sequence[float], path: str | Path, title: str = "") -> Path:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.6))
    ax.plot(steps, losses, marker="o", markersize=3)
    ax.set_xlabel("step")
    ax.set_ylabel("mean cross-entropy (global batch)")
    ax.set_title(title or "training loss")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    save_figure(fig, path, dpi=120)
    plt.close(fig)
    return Path(path)


def plot_layer_bytes(records: list[dict], path: str | Path, ranks: int, steps: int = 1,
                     phases: Sequence[str] = PASSES, title: str = "") -> Path:
    """Bytes per rank per step for every layer: one panel per phase, bars stacked by collective op."""
    plt = pyplot()
    layers: list[str] = []
    for r in records:
        layer = layer_of(r["scope"])
        if r["phase"] in phases and layer not in layers:
            layers.append(layer)
    ops = [op for op in OP_COLORS if any(r["op"] == op and r["phase"] in phases for r in records)]
    fig, axes = plt.subplots(1, len(phases), figsize=(5 * len(phases), 0.35 * len(layers) + 1.8),
                             sharey=True, squeeze=False)
    for ax, phase in zip(axes[0], phases):
        left = [0.0] * len(layers)
        for op in ops:
            widths = [0.0] * len(layers)
            for r in records:
                if r["phase"] == phase and r["op"] == op:
                    widths[layers.index(layer_of(r["scope"]))] += r["bytes"] / ranks / steps / 1024
            ax.barh(layers, widths, left=left, color=OP_COLORS[op], label=op)
            left = [a + b for a, b in zip(left, widths)]
        ax.set_title(phase)
        ax.set_xlabel("KiB per rank per step (logical bytes)")
        ax.grid(axis="x", alpha=0.3)
    axes[0][0].invert_yaxis()
    fig.legend(*axes[0][0].get_legend_handles_labels(), loc="lower center", ncol=len(ops), fontsize=8)
    fig.suptitle(title or "collective bytes per layer")
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    save_figure(fig, path, dpi=120)
    plt.close(fig)
    return Path(path)
