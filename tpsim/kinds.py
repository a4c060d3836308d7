"""What a stretch of compute *is* — matmul, elementwise, softmax/normalisation — marked where it happens, MPI-free.

The serial layers in ``tpsim.nn`` know what their arithmetic is but must not know about tracing (``nn`` never
imports ``comm``). So they mark it with a module-level object that does nothing until a recorder is installed:

    @kinds.marked(kinds.ELEMENTWISE)          # a whole function is one kind
    def gelu_forward(x, ...): ...

    with kinds.MATMUL_MARK:                   # or a few lines of a function that mixes kinds
        scores = q @ k.swapaxes(-1, -2)

``tpsim.comm.Tracer`` installs itself as the recorder for the length of each compute span it opens, so marks
are recorded only while a traced model runs, each as a span with a ``kind`` (``tpsim.trace.schema``) nested
inside the layer span around it. With no recorder a mark reads no clock: a marked function costs one extra
call and a check (~0.1 µs), a ``with`` block ~0.2 µs.

Kinds (the columns of ``tpsim report DIR --by kind``):

    matmul        the GEMMs of linear layers (their bias add and bias-gradient sum ride along) and of attention
    elementwise   GeLU, dropout masks applied, residual adds, attention's causal mask and 1/√d scale
    softmax_norm  softmax, LayerNorm, cross-entropy (row reductions and the elementwise work around them)
    layer         a module's forward or backward: the span the GPT wiring opens (what the others nest in)

The report adds three more, derived rather than marked: ``comm_wait`` and ``comm_transfer`` (a collective's
time, split by ``tpsim.trace.kind_split``), and ``other`` — the part of a layer's span inside no mark and no
collective: Python, reshapes and layout copies, embedding lookups, dropout-mask generation.
"""

from __future__ import annotations

import functools
from time import perf_counter

MATMUL, ELEMENTWISE, SOFTMAX_NORM = "matmul", "elementwise", "softmax_norm"
LAYER = "layer"
MARKED = (MATMUL, ELEMENTWISE, SOFTMAX_NORM)

_recorder = None  # a callable (kind, start, end) with perf_counter times, or None: marks record nothing


def install(recorder):
    """Make ``recorder(kind, start, end)`` receive every mark from now on (``None``: none); returns the old one."""
    global _recorder
    previous, _recorder = _recorder, recorder
    return previous


class Mark:
    """A reusable, re-entrant context manager timing a block as one ``kind`` (one object per kind, no allocation)."""

    __slots__ = ("kind", "starts")

    def __init__(self, kind: str) -> None:
        self.kind, self.starts = kind, []

    def __enter__(self) -> "Mark":
        self.starts.append(None if _recorder is None else perf_counter())
        return self

    def __exit__(self, *exc) -> bool:
        start = self.starts.pop()
        if start is not None and _recorder is not None:
            _recorder(self.kind, start, perf_counter())
        return False


MATMUL_MARK, ELEMENTWISE_MARK, SOFTMAX_NORM_MARK = Mark(MATMUL), Mark(ELEMENTWISE), Mark(SOFTMAX_NORM)
_MARKS = {m.kind: m for m in (MATMUL_MARK, ELEMENTWISE_MARK, SOFTMAX_NORM_MARK)}


def marked(kind: str):
    """Decorator: every call of the function is one mark of ``kind`` (a kind nested inside it is subtracted)."""
    if kind not in _MARKS:
        raise ValueError(f"kind must be one of {MARKED}, got {kind!r}")

    def wrap(fn):
        @functools.wraps(fn)
        def timed(*args, **kwargs):
            recorder = _recorder
            if recorder is None:  # the common case, untraced: one check, no clock read
                return fn(*args, **kwargs)
            start = perf_counter()  # inline rather than ``with Mark``: this runs a few times per layer call
            out = fn(*args, **kwargs)
            recorder(kind, start, perf_counter())
            return out
        return timed
    return wrap
