"""The registry of exercise checks: ``@exercise("02", "g_backward", "f_backward", g_backward=(hints...))``.

A check is ``fn(report)``: it builds inputs, computes the expected answer independently (the serial math or
the tpsim layer the lesson teaches), and hands both to ``report.compare`` together with *symptoms*: what each
typical mistake returns on the same inputs, so that a wrong result is described by what it looks like
(``tpsim.teach.diagnose``). Hints come in levels, from a nudge to the last one, which is close to the answer;
``tpsim check NN FILE --hint`` reveals them one at a time (``tpsim.teach.hints``).
"""

from __future__ import annotations

from typing import Callable

from tpsim.teach.verdict import Check, Report

CHECKS: dict[str, Check] = {}


def exercise(number: str, *functions: str, **hints: tuple[str, ...]) -> Callable:
    """Register ``fn(report)`` as the check of exercise ``number`` (functions in the order it calls them)."""
    def register(fn: Callable[[Report], None]) -> Callable[[Report], None]:
        if number in CHECKS:
            raise ValueError(f"exercise {number} has two checks")
        missing = [f for f in functions if not hints.get(f)]
        if missing:
            raise ValueError(f"exercise {number}: no hints for {', '.join(missing)}")
        CHECKS[number] = Check(number, functions, fn, {k: tuple(v) for k, v in hints.items()})
        return fn
    return register


def ops(r: Report) -> list[str]:
    """The collectives of the learner's last call, by name."""
    return [e.op for e in r.events]
