"""The time × rank grid drawn: a row per pipeline rank, a box per compute action, idle time hatched.

Colours tell F, B and W apart (a lighter shade for each later model chunk, so interleaved chunks show), every
box carries its micro-batch number (``3`` on chunk 0, ``3.1`` on chunk 1, as the text grid writes it), and the
rank-time where nothing runs is hatched grey: the bubble. ``draw`` draws one timeline, ``draw_stacked`` several one
under the other on one time scale, so schedules compare at a glance. Same data as ``tpsim.pipeline.grid``;
matplotlib (Agg) is imported only when a figure is drawn. MPI-free.
"""

from __future__ import annotations

from pathlib import Path

from tpsim import atomic
from tpsim.pipeline.actions import COMPUTE
from tpsim.pipeline.clock import Timeline

COLORS = {"F": "#4C72B0", "B": "#55A868", "W": "#8172B2"}
NAMES = {"F": "forward (F)", "B": "backward (B)", "W": "weight gradient (W)"}


def shade(color: str, chunk: int, chunks: int) -> tuple[float, float, float]:
    """``color`` mixed with white, more for later chunks (chunk 0 is the colour itself)."""
    rgb = [int(color[i:i + 2], 16) / 255 for i in (1, 3, 5)]
    mix = 0.55 * chunk / max(chunks - 1, 1) if chunks > 1 else 0.0
    return tuple(c + (1 - c) * mix for c in rgb)


def draw_on(ax, timeline: Timeline, title: str = "", step: float | None = None) -> None:
    """Draw ``timeline`` on matplotlib axes ``ax``: a row per rank, idle time hatched; the x axis runs to
    ``step`` (default the timeline's own), so several timelines drawn one under the other share one time scale."""
    from matplotlib.patches import Patch

    s = timeline.schedule
    end = step or timeline.step or 1.0
    for rank, (actions, spans) in enumerate(zip(s.ranks, timeline.spans)):
        ax.broken_barh([(0, timeline.step or end)], (rank - 0.4, 0.8), facecolor="white", edgecolor="#999999",
                       hatch="///", linewidth=0)
        for a, (start, stop) in zip(actions, spans):
            if a.op not in COMPUTE or stop <= start:
                continue
            ax.broken_barh([(start, stop - start)], (rank - 0.4, 0.8), facecolor=shade(COLORS[a.op], a.chunk, s.vp),
                           edgecolor="black", linewidth=0.5)
            text = f"{a.microbatch}" + (f".{a.chunk}" if a.chunk else "")
            ax.text((start + stop) / 2, rank, text, ha="center", va="center", fontsize=6, clip_on=True)
    ax.set_xlim(0, end)
    ax.set_ylim(s.pp - 0.5, -0.5)
    ax.set_yticks(range(s.pp), [f"rank {r}" for r in range(s.pp)])
    ax.set_xlabel("virtual time")
    used = [op for op in COMPUTE if any(a.op == op for actions in s.ranks for a in actions)]
    handles = [Patch(facecolor=COLORS[op], label=NAMES[op]) for op in used]
    handles += [Patch(facecolor=shade(COLORS["F"], c, s.vp), label=f"chunk {c} (lighter)") for c in range(1, s.vp)]
    handles.append(Patch(facecolor="white", edgecolor="#999999", hatch="///", label="idle"))
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.25), ncol=len(handles), fontsize=7,
              frameon=False)
    ax.set_title(title or f"{s.name}: pp {s.pp}, {s.microbatches} micro-batches"
                 + (f", vp {s.vp}" if s.vp > 1 else "") + f"; bubble {timeline.bubble_fraction:.4f}")


def draw(timeline: Timeline, path: str | Path, title: str = "") -> Path:
    """Draw ``timeline`` to ``path`` (PNG) and return the path."""
    from tpsim.plotting import pyplot

    plt = pyplot()
    s = timeline.schedule
    step = timeline.step or 1.0
    fig, ax = plt.subplots(figsize=(min(4 + 0.12 * step * s.vp * 3, 18), 0.6 * s.pp + 1.6))
    draw_on(ax, timeline, title)
    return _save(fig, path)


def draw_stacked(timelines: list[Timeline], path: str | Path, titles: list[str] | None = None) -> Path:
    """Several timelines one under the other on one time scale (the longest step), so their bubbles compare at a
    glance; ``titles[k]`` heads the k-th (default: its schedule, sizes and bubble)."""
    from tpsim.plotting import pyplot

    plt = pyplot()
    step = max(t.step for t in timelines) or 1.0
    rows = [t.schedule.pp for t in timelines]
    fig, axes = plt.subplots(len(timelines), 1, figsize=(min(4 + 0.36 * step, 18), sum(0.6 * r + 1.6 for r in rows)),
                             gridspec_kw={"height_ratios": rows}, squeeze=False)
    for k, (ax, t) in enumerate(zip(axes[:, 0], timelines)):
        draw_on(ax, t, (titles or [""] * len(timelines))[k], step=step)
    return _save(fig, path)


def _save(fig, path: str | Path) -> Path:
    from tpsim.plotting import pyplot

    fig.tight_layout()
    path = Path(path)
    atomic.save_figure(fig, path, dpi=130, metadata={"Software": None})
    pyplot().close(fig)
    return path
