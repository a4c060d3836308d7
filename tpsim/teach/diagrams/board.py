"""A blackboard measured in inches: boxes, arrows and labels placed by hand, as a teacher draws a block diagram.

The axes fill the whole figure and one data unit is one inch, so a layout can be sized from the text it must
hold (a 9-point line is 0.125 units tall, a character about 0.07 wide). Every box's label carries the box's
``gid``, so ``tpsim.teach.diagrams.legibility`` can check that each label fits inside its box.

The colours are the same in every diagram: f blue, g red; forward arrows solid and dark, backward arrows dashed.
"""

from __future__ import annotations

from dataclasses import dataclass

from tpsim.plotting import pyplot

F_COLOR = "#4C72B0"  # f, in every diagram
G_COLOR = "#C44E52"  # g, in every diagram
STAGE_COLOR = "#E8E8EE"  # a rank's local computation
LANE_COLOR = "#F6F6F6"  # the band of one rank
FORWARD = "#222222"
BACKWARD = "#8172B2"
QUIET = "#555555"  # headers, shapes, captions


@dataclass(frozen=True)
class Box:
    """A drawn box: lower-left corner ``(x, y)``, width ``w`` and height ``h``, in inches."""

    x: float
    y: float
    w: float
    h: float

    @property
    def right(self) -> float:
        return self.x + self.w

    @property
    def cx(self) -> float:
        return self.x + self.w / 2

    @property
    def cy(self) -> float:
        return self.y + self.h / 2

    @property
    def top(self) -> float:
        return self.y + self.h


def caption_space(caption: str) -> float:
    """Inches the caption takes at the bottom of a board (8-point lines), margin included."""
    return 0.2 + 0.15 * (caption.count("\n") + 1)


def subscript(n: int) -> str:
    """``12`` → ``₁₂`` (ranks as subscripts: A₀ is the block rank 0 holds)."""
    return str(n).translate(str.maketrans("0123456789", "₀₁₂₃₄₅₆₇₈₉"))


class Board:
    """A ``width`` × ``height`` inch figure with a bold title at the top and a caption line at the bottom."""

    def __init__(self, width: float, height: float, title: str, caption: str) -> None:
        self.fig = pyplot().figure(figsize=(width, height))
        self.ax = self.fig.add_axes((0, 0, 1, 1))
        self.ax.set_xlim(0, width)
        self.ax.set_ylim(0, height)
        self.ax.axis("off")
        self.width, self.height = width, height
        self._boxes = 0
        self.text(width / 2, height - 0.3, title, size=12, weight="bold")
        self.text(0.2, 0.12, caption, size=8, color=QUIET, ha="left", va="bottom")

    def text(self, x: float, y: float, s: str, size: float = 9, ha: str = "center", va: str = "center", **kw):
        return self.ax.text(x, y, s, fontsize=size, ha=ha, va=va, **kw)

    def box(self, x: float, y: float, w: float, h: float, label: str, color: str = STAGE_COLOR,
            text_color: str = FORWARD, size: float = 9, border: float = 1.0, **kw) -> Box:
        """A rounded box with its label in the middle; the patch and the label share a ``gid``."""
        from matplotlib.patches import FancyBboxPatch

        self._boxes += 1
        gid = f"box{self._boxes}"
        patch = FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0,rounding_size=0.06", facecolor=color,
                               edgecolor=FORWARD, linewidth=border, zorder=2)
        patch.set_gid(gid)
        self.ax.add_patch(patch)
        self.text(x + w / 2, y + h / 2, label, size=size, color=text_color, zorder=3, gid=gid, **kw)
        return Box(x, y, w, h)

    def band(self, box: Box, label: str) -> None:
        """The light background of one rank's lane, ``label`` in its top-left corner (not a box: no gid)."""
        from matplotlib.patches import Rectangle

        self.ax.add_patch(Rectangle((box.x, box.y), box.w, box.h, facecolor=LANE_COLOR, edgecolor="none",
                                    zorder=0))
        self.text(box.x + 0.08, box.top - 0.09, label, size=7.5, color=QUIET, ha="left", va="center")

    def arrow(self, start: tuple[float, float], end: tuple[float, float], label: str = "",
              backward: bool = False) -> None:
        """An arrow, dashed for the backward pass; ``label`` (a shape, say) sits just above its middle."""
        from matplotlib.patches import FancyArrowPatch

        self.ax.add_patch(FancyArrowPatch(start, end, arrowstyle="-|>", mutation_scale=11, linewidth=1.3,
                                          color=BACKWARD if backward else FORWARD,
                                          linestyle="--" if backward else "-", shrinkA=0, shrinkB=0, zorder=1))
        if label:
            self.text((start[0] + end[0]) / 2, (start[1] + end[1]) / 2 + 0.14, label, size=8, color=QUIET)
