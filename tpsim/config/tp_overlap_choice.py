"""``--tp-comm-overlap``: which layouts can pipeline their TP collectives with the GEMMs beside them, checked as
a run's configuration (``tpsim.config.Parallelism``) or a planner's ``Layout`` is made. Pure, no MPI.

Only sequence parallelism's collectives have a GEMM to hide behind: f̄'s all-gather feeds a GEMM that works on
each sequence chunk alone, ḡ's reduce-scatter takes a GEMM's output chunk by chunk. Plain TP's all-reduce (g,
and f's backward) cannot hide: its output is the next op's input, and nothing independent runs beside it. At
tp 1 there is no collective at all.
"""

from __future__ import annotations

from tpsim.errors import ConfigError


def tp_comm_overlap_problem(par) -> str | None:
    """Why ``par`` (a ``Parallelism`` or a planner ``Layout``) cannot run ``--tp-comm-overlap``, or None."""
    if not par.tp_comm_overlap:
        return None
    if not par.sp:
        return ("--tp-comm-overlap needs --sequence-parallel: it pipelines SP's all-gather and reduce-scatter with "
                "the GEMM beside them, chunk by chunk; plain TP's all-reduce cannot hide, its output is the next "
                "op's input and nothing independent runs beside it")
    if par.tp < 2:
        return f"--tp-comm-overlap needs --tp > 1 (at tp {par.tp} there is no collective to hide)"
    return None


def check_tp_comm_overlap(par) -> None:
    """``ConfigError`` (one line, the reason) unless ``par`` can run ``--tp-comm-overlap``."""
    problem = tp_comm_overlap_problem(par)
    if problem:
        raise ConfigError(problem)
