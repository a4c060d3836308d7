"""The parallel MLP and the parallel self-attention as Megatron-LM draws them (Shoeybi et al. 2019,
arXiv:1909.08053, Fig. 3): one lane per tensor-parallel rank between f, which opens the region, and g, which
closes it.

    mlp_diagram(p)               X → f → X·A_r → GeLU → ·B_r → g → Z
    attention_diagram(p, heads)  X → f → q, k, v of rank r's heads → softmax(q·kᵀ/√d)·v → ·B_r → g → Y

Both are ``region_diagram`` with different stages: what differs between the two blocks is only what each
rank computes between f and g.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from tpsim.teach.diagrams.board import F_COLOR, G_COLOR, QUIET, Board, Box, caption_space, subscript

MEGATRON = "Shoeybi et al. 2019 (Megatron-LM, arXiv:1909.08053)"
F_NOTE = "forward: identity\nbackward: all-reduce"
G_NOTE = "forward: all-reduce\nbackward: identity"
LANE, BOX_H, ARROW, GATE = 0.9, 0.5, 1.2, 0.45  # lane pitch, box height, arrow length, width of f and g
IO_W, IO_H, GAP, INSET = 1.0, 0.6, 0.45, 0.4  # X and Z boxes, their arrows to f and g, f to the first stage


@dataclass(frozen=True)
class Stage:
    """One local computation: ``header`` above the lanes, ``label(r)`` in rank r's box, ``shape`` of its output."""

    header: str
    label: Callable[[int], str]
    shape: str
    width: float = 1.3


def region_diagram(p: int, title: str, caption: str, source: str, sink: str, stages: list[Stage]):
    """``source → f → p lanes of stages → g → sink``; returns the matplotlib figure."""
    if p < 1:
        raise ValueError(f"a tensor-parallel group has at least one rank, not {p}")
    width = 0.2 + 2 * (IO_W + GAP + GATE) + INSET + sum(s.width + ARROW for s in stages) + 0.2
    lanes_bottom = caption_space(caption) + 0.75  # room for the notes under f and g
    lanes_top = lanes_bottom + p * LANE
    board = Board(width, lanes_top + 1.0, title, caption)
    mid = (lanes_bottom + lanes_top) / 2

    src = board.box(0.2, mid - IO_H / 2, IO_W, IO_H, source)
    f = board.box(src.right + GAP, lanes_bottom + 0.04, GATE, p * LANE - 0.08, "f", color=F_COLOR, text_color="white",
                  size=15, weight="bold")
    board.arrow((src.right, mid), (f.x, mid))
    board.text(f.cx, lanes_bottom - 0.38, F_NOTE, size=8, color=F_COLOR)

    lane_x, x = f.right + 0.06, f.right + INSET
    for stage in stages:
        board.text(x + stage.width / 2, lanes_top + 0.22, stage.header, size=8.5, color=QUIET, style="italic")
        x += stage.width + ARROW
    g = board.box(x, f.y, GATE, f.h, "g", color=G_COLOR, text_color="white", size=15, weight="bold")
    board.text(g.cx, lanes_bottom - 0.38, G_NOTE, size=8, color=G_COLOR)

    for r in range(p):
        lane = Box(lane_x, lanes_top - (r + 1) * LANE + 0.04, g.x - 0.06 - lane_x, LANE - 0.08)
        board.band(lane, f"rank {r}")
        _draw_lane(board, r, stages, start=(f.right, lane.y + 0.36), end_x=g.x)

    sink_box = board.box(g.right + GAP, mid - IO_H / 2, IO_W, IO_H, sink)
    board.arrow((g.right, mid), (sink_box.x, mid))
    return board.fig


def _draw_lane(board: Board, r: int, stages: list[Stage], start: tuple[float, float], end_x: float) -> None:
    """Rank r's boxes on the line ``y = start[1]``, from f's edge to g's, each output arrow labelled by shape."""
    x, y = start[0] + INSET, start[1]
    board.arrow(start, (x, y))
    for i, stage in enumerate(stages):
        box = board.box(x, y - BOX_H / 2, stage.width, BOX_H, stage.label(r), color="white")
        x = end_x if i == len(stages) - 1 else box.right + ARROW
        board.arrow((box.right, y), (x, y), label=stage.shape)


def mlp_diagram(p: int):
    """The parallel MLP on ``p`` ranks: c_fc split by columns (A_r), GeLU on the shard, c_proj by rows (B_r)."""
    stages = [
        Stage("c_fc: column-parallel", lambda r: f"X·A{subscript(r)}", "[b, s, 4h/p]"),
        Stage("GeLU, element by element", lambda r: f"Y{subscript(r)} = GeLU(·)", "[b, s, 4h/p]", 1.4),
        Stage("c_proj: row-parallel", lambda r: f"Y{subscript(r)}·B{subscript(r)}", "[b, s, h] partial"),
    ]
    caption = (f"After {MEGATRON}, Fig. 3a. X is the same on every rank; A{subscript(0)} is the block of A's "
               f"columns rank 0 holds, B{subscript(0)} the matching rows of B. Between f and g nothing moves.")
    return region_diagram(p, f"The parallel MLP on p = {p} rank{'s' if p > 1 else ''}: one all-reduce each way",
                          caption, "X\n[b, s, h]", "Z\n[b, s, h]", stages)


def heads_of(heads: int, p: int, r: int) -> str:
    """``"heads 2–3"``: the whole heads rank r owns when ``heads`` are split over ``p`` ranks."""
    if heads % p:
        raise ValueError(f"{heads} heads cannot be split evenly over {p} ranks")
    per = heads // p
    return f"head {r}" if per == 1 else f"heads {r * per}–{(r + 1) * per - 1}"


def attention_diagram(p: int, heads: int):
    """Parallel self-attention on ``p`` ranks: each rank owns ``heads / p`` whole heads, q, k and v included."""
    heads_of(heads, p, 0)  # refuses an uneven split before anything is drawn
    stages = [
        Stage("c_attn: column-parallel", lambda r: f"q, k, v of\n{heads_of(heads, p, r)}", "[b, s, 3h/p]"),
        Stage("attention core, per head", lambda r: "softmax(q·kᵀ/√d)·v", "[b, s, h/p]", 1.6),
        Stage("c_proj: row-parallel", lambda r: f"ctx{subscript(r)}·B{subscript(r)}", "[b, s, h] partial"),
    ]
    caption = (f"After {MEGATRON}, Fig. 3b. d = h / heads. The scores [b, heads/p, s, s] never leave their "
               f"rank; B{subscript(0)}: the rows of c_proj that read rank 0's heads.")
    return region_diagram(p, f"Parallel self-attention on p = {p} rank{'s' if p > 1 else ''}, {heads} heads: "
                          f"{heads // p} whole head{'s' if heads // p > 1 else ''} per rank", caption,
                          "X\n[b, s, h]", "Y\n[b, s, h]", stages)


__all__ = ["Stage", "attention_diagram", "heads_of", "mlp_diagram", "region_diagram"]
