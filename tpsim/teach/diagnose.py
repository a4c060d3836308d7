"""What a learner's result looks like, in words, without ever printing the answer (MPI-free).

A check hands ``diagnose`` the learner's value, the reference value and a few *symptoms*: for each mistake a
learner typically makes, the value that mistake produces on the same inputs, computed by the check itself.

    diagnose(got, expected, tol, {"each rank's own partial sum, not the group's": dy_local})

returns ``(None, False)`` when ``got`` matches ``expected``; the symptom's sentence when ``got`` matches what
that mistake produces (and the mistake really differs from the reference on these inputs); otherwise a
generic description that names no expected value, in the answer's *layout*:

    "values"  numbers compared entry by entry: the largest difference and where, how many entries differ,
              "yours is c × the reference everywhere" (only when that one factor holds for every entry and
              most entries are not zero); a single number: "too large" or "too small", never by how much
    "rows"    one answer per row (a vocabulary id per token, a (parameter, start, stop) triple per piece):
              which rows differ and what yours holds there
    "set"     integer ids (columns, heads, ranks): yours as a sorted set, how many belong and how many are
              missing, or "the right entries in the wrong order"

``layout=None`` infers it: a sorted list of distinct integers is a set, anything else values. Whatever the
learner returned (None, text, a ragged list, NaN, complex numbers: ``tpsim.teach.returned``) gets a sentence,
never an exception. The shape is named only when it differs from the answer's.
"""

from __future__ import annotations

import warnings
from typing import Mapping

import numpy as np

from tpsim.teach.returned import as_numbers, number

LAYOUTS = ("values", "rows", "set")
SHOWN = 4  # rows or runs of ids listed before "and N more"


def ranges(index) -> str:
    """``[0 1 2 3 8 9]`` -> ``"0–3, 8–9"``: integer ids read at a glance (a long list ends "… (N runs)")."""
    values = np.asarray(index).ravel().tolist()
    if not values:
        return "(empty)"
    if not all(abs(float(v)) < 2 ** 53 and float(v) == round(float(v)) for v in values):  # not ids: numbers
        return ", ".join(number(v) for v in values[:3 * SHOWN]) + (", …" if len(values) > 3 * SHOWN else "")
    runs, start = [], None
    for v in (int(round(float(v))) for v in values):
        if start is None:
            start = prev = v
        elif v != prev + 1:
            runs.append((start, prev))
            start = v
        prev = v
    runs.append((start, prev))
    text = ", ".join(str(a) if a == b else f"{a}–{b}" if a >= 0 else f"{a} to {b}" for a, b in runs[:3 * SHOWN])
    return text + (f", … ({len(runs)} runs)" if len(runs) > 3 * SHOWN else "")


def infer_layout(expected: np.ndarray) -> str:
    """A sorted 1-D array of distinct integers is a set of ids; everything else is compared as values."""
    flat = expected.ravel()
    if expected.ndim == 1 and expected.size > 1 and expected.dtype.kind in "iu" and np.all(np.diff(flat) > 0):
        return "set"
    return "values"


def _close(got: np.ndarray, expected: np.ndarray, tol: float) -> np.ndarray:
    """Entry by entry: within ``tol``, or the same infinity, or both NaN."""
    return (np.abs(got - expected) <= tol) | (got == expected) | (np.isnan(got) & np.isnan(expected))


def _shape(a: np.ndarray) -> str:
    return "shape () (a single number)" if a.ndim == 0 else f"shape {a.shape}"


def _index(where: tuple) -> str:
    return str(where[0]) if len(where) == 1 else str(where)


def _answer(expected: np.ndarray) -> str:
    return "the answer is a single number" if expected.ndim == 0 else f"the answer has shape {expected.shape}"


def _other_shape(got: np.ndarray, expected: np.ndarray, tol: float) -> list[str]:
    lines = [f"expected {_shape(expected)}, got {_shape(got)}"]
    if got.size == expected.size and got.size > 1:
        if _close(got.ravel(), expected.ravel(), tol).all():
            lines.append("the right values in the wrong shape (a reshape, or a missing [0] or squeeze?)")
        elif got.ndim == 2 and got.T.shape == expected.shape and _close(got.T, expected, tol).all():
            lines.append("the transpose of the right values")
    return lines


def _of(k, n, noun: tuple[str, str], verb: tuple[str, str] = ("", ""), whose: str = "the") -> str:
    """``"1 of the 3 entries differs"``, ``"2 of your 5 rows differ"``: counts whose words agree with them."""
    k, n = int(k), int(n)
    said = verb[0] if k == 1 else verb[1]
    return f"{k} of {whose} {n} {noun[0] if n == 1 else noun[1]}" + (f" {said}" if said else "")


ENTRIES, ROWS = ("entry", "entries"), ("row", "rows")
DIFFER, IS = ("differs", "differ"), ("is", "are")


def _not_finite(got: np.ndarray, bad: np.ndarray) -> list[str]:
    where = tuple(int(i) for i in np.argwhere(bad)[0])
    value = got[where]
    cause = ("0/0, inf − inf or a log of a negative number?" if np.isnan(value) else
             "an overflow, say in exp, or a division by zero?")
    if not where:
        return [f"got {value}: not a finite number ({cause})"]
    count = f"; {_of(bad.sum(), got.size, ENTRIES, IS)} not finite" if got.size > 1 else ""
    return [f"got {value} at index {_index(where)}: not a finite number{count} ({cause})"]


def _values(got: np.ndarray, expected: np.ndarray, close: np.ndarray, tol: float) -> list[str]:
    if expected.size == 1:  # one number: too large or too small, never by how much (that would give it away)
        g, e = float(got.ravel()[0]), float(expected.ravel()[0])
        return [f"got {number(g)}: too {'large' if g > e else 'small'}"]
    diff = np.where(close, 0.0, np.abs(got - expected))
    where = tuple(int(i) for i in np.unravel_index(int(np.argmax(diff)), diff.shape))
    lines = [f"max |got − expected| = {float(diff[where]):.3g} at index {_index(where)}",
             _of((~close).sum(), got.size, ENTRIES, DIFFER) + (f" by more than {tol:g}" if tol else "")]
    if not got.any():
        lines.append("yours is all zeros")
    ratio = _ratio(got, expected, tol)
    if ratio is not None:
        lines.append(f"yours is {ratio:.6g} × the reference everywhere")
    return lines


def _ratio(got: np.ndarray, expected: np.ndarray, tol: float) -> float | None:
    """The one factor c with got = c · expected at every entry, or ``None``. Only when most entries are not zero:
    on a tuple such as (0, 4) any factor "holds" at the zero, and an off-by-one would read as a scale."""
    nonzero = (expected != 0) & np.isfinite(expected)
    count = int(nonzero.sum())
    if count < 2 or 2 * count <= expected.size:
        return None
    c = float(got[nonzero][0] / expected[nonzero][0])
    if not np.isfinite(c) or c == 0 or abs(c - 1) <= 1e-6:
        return None
    return c if np.allclose(got, c * expected, rtol=1e-9, atol=tol) else None


def _rows(got: np.ndarray, expected: np.ndarray, close: np.ndarray) -> list[str]:
    n = expected.shape[0]
    wrong = np.flatnonzero(~close.reshape(n, -1).all(axis=1))

    def row(i: int) -> str:
        values = got[i].ravel()
        text = ", ".join(number(v) for v in values[:8]) + (", …" if values.size > 8 else "")
        return text if got.ndim == 1 else f"({text})"

    listed = ", ".join(f"row {i} (yours {row(int(i))})" for i in wrong[:SHOWN])
    more = f", and {len(wrong) - SHOWN} more" if len(wrong) > SHOWN else ""
    return [f"{_of(len(wrong), n, ROWS, DIFFER)}: {listed}{more}"]


def _set(got: np.ndarray, expected: np.ndarray, tol: float) -> list[str]:
    lines = [] if got.shape == expected.shape else [f"expected {_shape(expected)}, got {_shape(got)}"]
    mine = got.ravel()
    if not np.isfinite(mine).all():
        return lines + _not_finite(got, ~np.isfinite(got))
    fraction = np.flatnonzero(mine != np.round(mine))
    if fraction.size:
        lines.append(f"yours holds values that are not whole numbers ({number(mine[fraction[0]])} at index "
                     f"{fraction[0]}): ids are integers")
    distinct, counts = np.unique(mine, return_counts=True)
    if not distinct.size:
        return lines + ["yours is empty"]
    in_order = bool(np.all(np.diff(mine) > 0))
    lines.append(f"yours{'' if in_order else ', as a sorted set'}: {ranges(distinct)}")
    repeats = counts > 1
    if repeats.any():
        lines.append(f"yours repeats {ranges(distinct[repeats])}")
    wanted = np.unique(expected)
    if distinct.size == wanted.size and _close(distinct, wanted, tol).all():
        lines.append("the right entries, but some more than once" if repeats.any() else
                     "the right entries in the wrong order")
        return lines
    noun = ("distinct entry", "distinct entries") if repeats.any() else ENTRIES
    belong = _of(np.isin(distinct, wanted).sum(), distinct.size, noun, ("belongs", "belong"), "your")
    missing = (~np.isin(wanted, distinct)).sum()
    lines.append(f"{belong} in the answer; " + (_of(missing, wanted.size, ENTRIES, IS, "the answer's") + " missing "
                                                "from yours" if wanted.size else "the answer has none"))
    return lines


def explain_difference(got, expected, tol: float, layout: str | None = None) -> list[str] | None:
    """``None`` if ``got`` matches ``expected`` within ``tol``; otherwise lines saying how it differs, in
    ``layout`` (``"values"``, ``"rows"``, ``"set"``; ``None``: inferred from ``expected``). Never raises for
    any ``got``; ``expected`` is the check's own array of numbers."""
    if layout not in (None, *LAYOUTS):
        raise ValueError(f"layout must be one of {LAYOUTS} or None, got {layout!r}")
    expected = np.asarray(expected)
    layout = layout or infer_layout(expected)
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        read = as_numbers(got)
        if isinstance(read, str):
            return [read, _answer(expected)]
        mine, kind = read
        lines = _explain(mine, expected.astype(np.float64), tol, layout)
    if lines and kind == "b" and expected.dtype.kind != "b":
        lines.insert(0, "your function returned booleans (True/False, read as 1/0), not numbers")
    return lines


def _explain(got: np.ndarray, expected: np.ndarray, tol: float, layout: str) -> list[str] | None:
    if got.shape != expected.shape:
        return _set(got, expected, tol) if layout == "set" else _other_shape(got, expected, tol)
    close = _close(got, expected, tol)
    if close.all():
        return None
    bad = ~np.isfinite(got) & ~close
    if bad.any():
        return _not_finite(got, bad)
    if layout == "set":
        return _set(got, expected, tol)
    if layout == "rows" and expected.ndim >= 1:
        return _rows(got, expected, close)
    return _values(got, expected, close, tol)


def matches(got, expected, tol: float) -> bool:
    """``got`` holds numbers of ``expected``'s shape, each within ``tol`` of it (cheap: no sentences)."""
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mine, theirs = as_numbers(got), as_numbers(expected)
        if isinstance(mine, str) or isinstance(theirs, str) or mine[0].shape != theirs[0].shape:
            return False
        return bool(_close(mine[0], theirs[0], tol).all())


def difference(got, expected) -> float:
    """``max |got − expected|`` over the entries (0 when empty, ``inf`` when ``got`` is not numbers of that shape)."""
    with np.errstate(all="ignore"):
        read = as_numbers(got)
        expected = np.asarray(expected, dtype=np.float64)
        if isinstance(read, str) or read[0].shape != expected.shape:
            return float("inf")
        if not expected.size:
            return 0.0
        diff = np.where(_close(read[0], expected, 0.0), 0.0, np.abs(read[0] - expected))
        return float(np.max(diff))


def diagnose(got, expected, tol: float, symptoms: Mapping[str, object] | None = None,
             layout: str | None = None) -> tuple[list[str] | None, bool]:
    """``(lines, named)``: ``lines`` None when right; ``named`` True when a symptom explains the difference."""
    lines = explain_difference(got, expected, tol, layout)
    if lines is None:
        return None, False
    for sentence, produced in (symptoms or {}).items():
        if produced is None or matches(produced, expected, tol):
            continue  # this mistake gives the right answer on these inputs: it cannot be told apart here
        if matches(got, produced, tol):
            return [sentence], True
    return lines, False
