"""f and g, forward and backward, on p ranks: the picture of lesson 02's claim that they are conjugate.

A 2 × 2 board: columns f and g, rows forward (solid arrows, left to right) and backward (dashed, right to
left). Each box names its operation and the one it equals; an all-reduce has a thick border, so the diagonal
pairs — f's backward and g's forward, g's backward and f's forward — can be seen before they are read.
"""

from __future__ import annotations

from tpsim.teach.diagrams.blocks import MEGATRON
from tpsim.teach.diagrams.board import F_COLOR, G_COLOR, QUIET, Board, caption_space, subscript

PITCH, CELL, LEFT = 0.42, 3.6, 1.3  # lane pitch, width of one operator's cell, where the first cell starts
ROW_GAP = 0.4  # above each row: its header
SIGMA = "Σᵣ "


def f_g_diagram(p: int):
    """The four passes of f and g on ``p`` ranks (lanes); returns the matplotlib figure."""
    if p < 1:
        raise ValueError(f"a tensor-parallel group has at least one rank, not {p}")
    row = max(p, 2) * PITCH
    caption = (f"Thick border: an all-reduce. δ{subscript(0)}, δ{subscript(1)}, …: each rank's own term of the "
               "gradient; Σᵣ: the sum over the ranks, handed to every rank.\nEach one's backward is the other's "
               f"forward, because copying and summing are each other's transpose.\nAfter {MEGATRON}, §3 and Fig. 3.")
    height = caption_space(caption) + 0.15 + 2 * (row + ROW_GAP) + 0.2 + 0.6
    board = Board(LEFT + 2 * CELL + 0.2, height, f"f and g on p = {p} rank{'s' if p > 1 else ''}: "
                  "each one's backward is the other's forward", caption)
    top = height - 0.6
    for i, (name, megatron, color) in enumerate((("f", "copy_to_tensor_model_parallel_region", F_COLOR),
                                                 ("g", "reduce_from_tensor_model_parallel_region", G_COLOR))):
        board.text(LEFT + i * CELL + 1.7, top, f"{name}: {megatron}", size=9, color=color, weight="bold")
    same, sums = ["x"] * p, [f"z{subscript(r)}" for r in range(p)]
    deltas = [f"δ{subscript(r)}" for r in range(p)]
    passes = [  # (row, column, operation, what it equals, left labels, right labels)
        (0, 0, "identity", "g backward", same, same),
        (0, 1, "all-reduce", "f backward", sums, [SIGMA + "zᵣ"] * p),
        (1, 0, "all-reduce", "g forward", [SIGMA + "δᵣ"] * p, deltas),
        (1, 1, "identity", "f forward", ["δ"] * p, ["δ"] * p),
    ]
    headers = ("forward: activations flow left to right", "backward: gradients flow right to left (dashed)")
    row_tops = [top - 0.2 - ROW_GAP - k * (row + ROW_GAP) for k in range(2)]
    for row_top, header in zip(row_tops, headers):
        board.text(0.2, row_top + 0.15, header, size=9, ha="left", weight="bold", color=QUIET)
        for r in range(p):
            board.text(LEFT - 0.1, row_top - (r + 0.5) * row / p, f"rank {r}", size=8, color=QUIET, ha="right")
    for k, column, op, equals, left, right in passes:
        _pass(board, LEFT + column * CELL, row_tops[k], row, (F_COLOR, G_COLOR)[column], op, equals, left, right,
              backward=k == 1)
    return board.fig


def _pass(board: Board, x0: float, top: float, height: float, color: str, op: str, equals: str,
          left: list[str], right: list[str], backward: bool) -> None:
    """One operator in one direction: labels on p lanes, arrows through one tall box."""
    p = len(left)
    box = board.box(x0 + 1.1, top - height + 0.04, 1.3, height - 0.08, f"{op}\n= {equals}", color=color,
                    text_color="white", size=8.5, border=3.0 if op == "all-reduce" else 0.8)
    for r in range(p):
        y = top - (r + 0.5) * height / p
        board.text(x0 + 0.35, y, left[r], size=9)
        board.text(x0 + 3.1, y, right[r], size=9)
        ends = [((x0 + 0.65, y), (box.x, y)), ((box.right, y), (x0 + 2.8, y))]
        for start, end in ends:
            board.arrow(*((end, start) if backward else (start, end)), backward=backward)
