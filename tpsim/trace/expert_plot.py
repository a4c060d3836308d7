"""experts.png: a mixture of experts' load, per MoE layer and step, from metrics.jsonl's ``moe`` records.

One panel per MoE layer: tokens per expert (every rank and micro-batch, each of a token's k choices) as an image,
steps down, experts across, beside the imbalance (the busiest expert's load over the mean) per step — a hot
expert is a bright column, and the step waits for the rank that holds it. Written by the demo's run folder when
the run had experts.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tpsim.atomic import save_figure
from tpsim.plotting import pyplot


def plot_expert_load(metrics: list[dict], path: str | Path, title: str = "") -> Path | None:
    """experts.png from ``metrics`` (None when no step has a ``moe`` record)."""
    rows = [m for m in metrics if "moe" in m]
    if not rows:
        return None
    plt = pyplot()
    layers = rows[0]["moe"]["layers"]
    steps = [m["step"] for m in rows]
    fig, axes = plt.subplots(len(layers), 2, figsize=(9, 2.4 * len(layers) + 0.6), squeeze=False,
                             gridspec_kw={"width_ratios": [3, 1]})
    for i, name in enumerate(layers):
        load = np.array([m["moe"]["tokens_per_expert"][i] for m in rows])
        ax, side = axes[i]
        image = ax.imshow(load, aspect="auto", cmap="viridis", interpolation="nearest",
                          extent=(-0.5, load.shape[1] - 0.5, steps[-1] + 0.5, steps[0] - 0.5))
        ax.set_title(f"{name}: tokens per expert", fontsize=9)
        ax.set_xlabel("expert")
        ax.set_ylabel("step")
        fig.colorbar(image, ax=ax, fraction=0.04)
        side.plot([m["moe"]["imbalance"][i] for m in rows], steps, marker=".")
        side.axvline(1.0, color="grey", lw=0.8, ls="--")
        side.invert_yaxis()
        side.set_title("imbalance (max/mean)", fontsize=9)
        side.set_xlabel("1 = balanced")
    fig.suptitle(title or "expert load", fontsize=10)
    fig.tight_layout()
    save_figure(fig, path, dpi=110)
    plt.close(fig)
    return Path(path)
