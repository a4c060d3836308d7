"""bytes_vs_tp.png: collective bytes per rank per step vs TP, measured points on ``predict_step``'s lines.

Logical bytes (the size of each collective's tensor) on the left, wire bytes (what one rank sends under the
ring algorithm, ``tpsim.cost.wire_bytes``) on the right, one line per (phase, op, group) and their total.
"""

from __future__ import annotations

from pathlib import Path

from tpsim.plotting import pyplot
from tpsim.figures.style import TOY, TP_SIZES, save_figure, tp_axes


def series_of(rows, ranks: int = 1) -> dict[str, list[float]]:
    """``{"<phase> <op> (<GROUP>)": [bytes, wire bytes]}`` per rank, summed over layers (records or Predictions)."""
    out: dict[str, list[float]] = {}
    for r in rows:
        get = r.get if isinstance(r, dict) else lambda k, r=r: getattr(r, k)
        acc = out.setdefault(f"{get('phase')} {get('op')} ({get('group').upper()})", [0.0, 0.0])
        acc[0] += get("bytes") / ranks
        acc[1] += get("wire_bytes") / ranks
    return out


def plot_bytes_vs_tp(measured: dict[int, list[dict]], predicted: dict[int, list], path: Path) -> Path:
    plt = pyplot()
    names = sorted({k for tp in TP_SIZES for k in series_of(predicted[tp])},
                   key=lambda k: -max(series_of(predicted[tp]).get(k, [0])[0] for tp in TP_SIZES))
    fig, axes = plt.subplots(1, 2, figsize=(11, 5.2), sharey=True)
    styles = ["-", "--", "-.", ":"]
    for ax, col, what in zip(axes, (0, 1), ("logical bytes (size of each collective's tensor)",
                                            "wire bytes (what one rank sends, ring algorithm)")):
        for i, name in enumerate(names + ["total"]):
            color, style = ("black", "-") if name == "total" else (f"C{i}", styles[i % len(styles)])

            def ys(rows, ranks=1):
                s = series_of(rows, ranks)
                return sum(v[col] for v in s.values()) if name == "total" else s.get(name, [0, 0])[col]

            pred = [ys(predicted[tp]) / 1024 for tp in TP_SIZES]
            meas = [ys(measured[tp], tp) / 1024 for tp in TP_SIZES]
            ax.plot(TP_SIZES, pred, style, color=color, lw=1.8, label=f"{name}, predicted")
            ax.plot(TP_SIZES, meas, "os^vD"[i % 5], color=color, mfc="none", ms=9 - i, label=f"{name}, measured")
        tp_axes(ax, "tensor-parallel degree TP (DP = 1)")
        ax.set_title(what, fontsize=10)
    axes[0].set_ylabel("KiB per rank per training step")
    axes[0].text(1.1, 60, "every all-reduce carries the whole [b, s, h]:\nthe same bytes at any TP", fontsize=8)
    axes[1].text(1.1, 60, "the ring sends 2(p−1)/p of it:\n×1 at TP 2, ×1.5 at 4, ×1.75 at 8", fontsize=8)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=7.5, loc="lower center", ncol=len(names) + 1, bbox_to_anchor=(0.5, 0.07))
    title = (f"Collective bytes per rank per step vs TP — toy GPT (h {TOY['hidden']}, {TOY['layers']} layers, "
             f"vocab {TOY['vocab']}, batch {TOY['batch_size']} x seq {TOY['seq_len']}, float64)")
    return save_figure(fig, path, title,
                       "Measured: `python -m tpsim.demo --tp T --dp 1`, step 1 of comm.jsonl, "
                       "averaged per rank. Predicted: tpsim.predict.formulas.predict_step (Shoeybi et al. "
                       "2019: 2 all-reduces of b·s·h forward, 2 backward per block; loss: 3 of b·s). At "
                       "TP 1 nothing goes on the wire (0 is not drawn on a log axis).", bottom=0.17)
