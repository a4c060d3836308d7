"""Is a drawn figure readable? Measured on the renderer, the way a reader's eye would find the faults.

    texts(fig)                 every visible, non-empty text of the figure, in drawing order
    overlapping_texts(fig)     pairs of texts whose rendered extents intersect
    texts_off_figure(fig)      texts that stick out of the canvas
    labels_outside_boxes(fig)  box labels (``Board.box``: label and patch share a gid) wider or taller than the box

Each returns the offending strings, so a test can say which labels collide, not only that some do.
"""

from __future__ import annotations

from itertools import combinations


def texts(fig) -> list:
    """The figure's visible text artists with something to show (its own and its axes')."""
    found = list(fig.texts) + [t for ax in fig.axes for t in ax.texts]
    return [t for t in found if t.get_visible() and t.get_text().strip()]


def _extents(fig) -> list[tuple[str, object]]:
    renderer = fig.canvas.get_renderer()
    return [(t.get_text(), t.get_window_extent(renderer)) for t in texts(fig)]


def overlapping_texts(fig, gap: float = 1.0) -> list[tuple[str, str]]:
    """Pairs of texts closer than ``gap`` pixels (an overlap is a negative gap)."""
    boxes = [(s, b.expanded(1, 1).padded(gap / 2)) for s, b in _extents(fig)]
    return [(s, t) for (s, a), (t, b) in combinations(boxes, 2) if a.overlaps(b)]


def texts_off_figure(fig) -> list[str]:
    canvas = fig.bbox
    return [s for s, b in _extents(fig) if b.x0 < canvas.x0 or b.y0 < canvas.y0 or b.x1 > canvas.x1
            or b.y1 > canvas.y1]


def labels_outside_boxes(fig) -> list[str]:
    """Labels of ``Board.box`` that do not fit inside their own box."""
    renderer = fig.canvas.get_renderer()
    patches = {p.get_gid(): p.get_window_extent(renderer) for ax in fig.axes for p in ax.patches if p.get_gid()}
    outside = []
    for t in texts(fig):
        box = patches.get(t.get_gid())
        if box is None:
            continue
        b = t.get_window_extent(renderer)
        if b.x0 < box.x0 or b.y0 < box.y0 or b.x1 > box.x1 or b.y1 > box.y1:
            outside.append(t.get_text())
    return outside
