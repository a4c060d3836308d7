"""Schedule generators: AFAB (GPipe) and 1F1B here; interleaved 1F1B (``interleaved.py``) and ZB-H1
(``zero_bubble.py``) in their own files, all four in ``SCHEDULES``.

- **AFAB** (all forwards, all backwards; GPipe, Huang et al. 2019, arXiv:1811.06965): every rank runs the m
  forwards, then the m backwards. Each stage holds all m micro-batches' activations at its peak.
- **1F1B** (PipeDream-Flush, Narayanan et al. 2021, arXiv:2104.04473, §2.2.1; Megatron-LM's
  ``forward_backward_pipelining_without_interleaving``): rank i runs ``min(p − i − 1, m)`` warm-up forwards, then
  alternates one forward and one backward, then drains the backwards left, so it holds at most min(p − i, m)
  micro-batches. Same bubble as AFAB, (p − 1)/(m + p − 1) of the step with unit costs, far less memory.

    build("1f1b", pp=4, microbatches=8)      -> Schedule (every rank's actions, sends and receives included)

MPI-free.
"""

from __future__ import annotations

from typing import Callable

from tpsim.errors import ConfigError
from tpsim.pipeline.actions import Schedule, with_messages
from tpsim.pipeline.interleaved import interleaved
from tpsim.pipeline.zero_bubble import zb_h1

Generator = Callable[[int, int, int], list[list[tuple[str, int, int]]]]  # (pp, m, vp) -> each rank's compute


def afab(pp: int, m: int, vp: int = 1) -> list[list[tuple[str, int, int]]]:
    """Every rank: the m forwards, then the m backwards (in micro-batch order)."""
    return [[("F", j, 0) for j in range(m)] + [("B", j, 0) for j in range(m)] for _ in range(pp)]


def one_f_one_b(pp: int, m: int, vp: int = 1) -> list[list[tuple[str, int, int]]]:
    """Rank i: min(p − i − 1, m) warm-up forwards, then one forward and one backward at a time, then the rest."""
    ranks = []
    for i in range(pp):
        warm = min(pp - i - 1, m)
        order = [("F", j, 0) for j in range(warm)]
        for k in range(m - warm):
            order += [("F", warm + k, 0), ("B", k, 0)]
        ranks.append(order + [("B", j, 0) for j in range(m - warm, m)])
    return ranks


SCHEDULES: dict[str, Generator] = {"afab": afab, "1f1b": one_f_one_b, "interleaved": interleaved,
                                   "zb-h1": zb_h1}
ONE_CHUNK = ("afab", "1f1b", "zb-h1")  # schedules that take no --vp


def compute_orders(name: str, pp: int, microbatches: int, vp: int = 1) -> list[list[tuple[str, int, int]]]:
    """Each rank's compute order ``[(op, micro-batch, chunk), ...]`` of schedule ``name`` (no sends or receives
    yet); ``ConfigError`` (one line) for an unknown name or sizes it cannot take."""
    if name not in SCHEDULES:
        raise ConfigError(f"--schedule {name}: unknown (one of {', '.join(SCHEDULES)})")
    if pp < 1 or microbatches < 1 or vp < 1:
        raise ConfigError(f"--pp {pp}, --microbatches {microbatches}, --vp {vp}: each must be at least 1")
    if name in ONE_CHUNK and vp != 1:
        raise ConfigError(f"--schedule {name} runs one model chunk per rank: --vp {vp} needs --schedule interleaved")
    return SCHEDULES[name](pp, microbatches, vp)


def build(name: str, pp: int, microbatches: int, vp: int = 1) -> Schedule:
    """Schedule ``name`` for ``pp`` ranks, ``microbatches`` micro-batches and ``vp`` model chunks per rank: the
    compute orders with the sends and receives they imply (``with_messages``)."""
    compute = compute_orders(name, pp, microbatches, vp)
    ranks = tuple(with_messages(pp, vp, r, compute[r]) for r in range(pp))
    return Schedule(name, pp, microbatches, vp, ranks)
