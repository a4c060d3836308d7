"""What a learner's result looks like, in words, without ever printing the answer (MPI-free).

A check hands ``diagnose`` the learner's value, the reference value and a few *symptoms*: for each mistake a
learner typically makes, the value that mistake produces on the same inputs, computed by the check itself.

    diagnose(got, expected, tol, {"each rank's own partial sum, not the group's": dy_local})

returns ``None`` when ``got`` matches ``expected``; the symptom's sentence when ``got`` matches what that mistake
produces (and the mistake really differs from the reference on these inputs); otherwise a generic description
— shapes, the largest difference and where, "got = c × expected" — that names no expected value.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np


def ranges(index: np.ndarray) -> str:
    """``[0 1 2 3 8 9]`` -> ``"0–3, 8–9"``: integer index arrays read at a glance."""
    runs, start = [], None
    for i, v in enumerate(index.tolist()):
        if start is None:
            start = prev = v
        elif v != prev + 1:
            runs.append((start, prev))
            start = v
        prev = v
        if i == len(index) - 1:
            runs.append((start, prev))
    return ", ".join(str(a) if a == b else f"{a}–{b}" for a, b in runs) or "(empty)"


def _as_array(got, expected: np.ndarray) -> np.ndarray | list[str]:
    if got is None:
        return ["your function returned None (a missing return statement?)",
                f"expected shape {expected.shape}, got nothing"]
    try:
        return np.asarray(got, dtype=np.result_type(expected.dtype, np.float64))
    except (TypeError, ValueError):
        return [f"your function returned a {type(got).__name__}, expected an array of shape {expected.shape}"]


def _integers(got: np.ndarray, expected: np.ndarray, head: str) -> list[str] | None:
    """Index arrays (which columns, which rows): what yours holds and how many are right — not the answer."""
    if np.array_equal(got, expected):
        return None
    right = int(np.isin(got, expected).sum())
    return [head, f"yours: {ranges(got.astype(np.int64))}",
            f"{right} of your {got.size} entries belong in the answer"]


def _scalar(got: np.ndarray, expected: np.ndarray, tol: float) -> list[str] | None:
    """One number: too large or too small, never by how much (that would give it away)."""
    g, e = float(got.reshape(-1)[0]), float(expected.reshape(-1)[0])
    if abs(g - e) <= tol:
        return None
    return [f"got {g:.6g}: too {'large' if g > e else 'small'}"]


def explain_difference(got, expected, tol: float) -> list[str] | None:
    """``None`` if ``got`` matches ``expected`` within ``tol``; otherwise lines saying how it differs."""
    expected = np.asarray(expected)
    got = _as_array(got, expected)
    if isinstance(got, list):
        return got
    head = f"expected shape {expected.shape}, got shape {got.shape}"
    if got.shape != expected.shape:
        return [head]
    if got.size == 0:
        return None
    bad = ~np.isfinite(got)
    if bad.any():
        where = tuple(int(i) for i in np.argwhere(bad)[0])
        return [head, f"got {got[where]} at index {where}: not finite (an overflow in exp? subtract the max first)"]
    if expected.dtype.kind in "iub":
        return _integers(got, expected, head)
    if expected.size == 1:
        return _scalar(got, expected, tol)
    diff = np.abs(got - expected)
    worst = float(diff.max())
    if worst <= tol:
        return None
    where = tuple(int(i) for i in np.unravel_index(int(diff.argmax()), diff.shape))
    lines = [head, f"max |got − expected| = {worst:.3g} at index {where}"]
    if expected[where] != 0:
        ratio = got[where] / expected[where]
        if abs(ratio - 1) > 1e-6 and np.allclose(got, ratio * expected, rtol=1e-9, atol=tol):
            lines.append(f"got = {ratio:.6g} × expected everywhere")
    return lines


def diagnose(got, expected, tol: float, symptoms: Mapping[str, object] | None = None) -> tuple[list[str] | None, bool]:
    """``(lines, named)``: ``lines`` None when right; ``named`` True when a symptom explains the difference."""
    with np.errstate(all="ignore"):  # a learner's overflow is reported in words, not as a NumPy warning
        lines = explain_difference(got, expected, tol)
        if lines is None:
            return None, False
        for sentence, produced in (symptoms or {}).items():
            if produced is None or explain_difference(produced, expected, tol) is None:
                continue  # this mistake gives the right answer on these inputs: it cannot be told apart here
            if explain_difference(got, produced, tol) is None:
                return [sentence], True
    return lines, False
