"""The course as a path: for each lesson what it needs first, what it checks, and how long its run takes.

``tpsim lesson list`` and the book's index show these beside each lesson's title, rank count and exercises (the
exercises are found by file name, not listed here); docs/course.md gives the week's order. A lesson's
prerequisites are the lessons whose results it uses without re-deriving them — read those first. ``seconds``
is the measured wall time of ``tpsim lesson run NN`` (``MEASURED`` says where), rounded up: a learner's budget,
not a benchmark. ``tests/test_course.py`` holds this table to the lessons folder: every lesson has an entry,
prerequisites come earlier, and the week covers every lesson once. Pure data, no MPI.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Stop:
    """One lesson on the path: the lessons it builds on, what its CHECKs establish (one line), its run time."""

    needs: tuple[str, ...]
    checks: str
    seconds: int


MEASURED = "tpsim lesson run NN on a shared 2-core machine (2026-12-01), the longest of two runs"

COURSE: dict[str, Stop] = {
    "01": Stop((), "eq. (1) and (2) of the SenseParrots article: column and row splits of X·A", 1),
    "02": Stop(("01",), "f and g against serial gradients; why they are conjugate", 1),
    "03": Stop(("02",), "column- and row-parallel layers = serial, forward and weight gradients", 1),
    "04": Stop(("03",), "GeLU forbids the early gather; one all-reduce forward, one backward", 1),
    "05": Stop(("04",), "attention split by heads = serial; the contiguous qkv split is wrong", 2),
    "06": Stop(("03",), "the loss from three [tokens] all-reduces, logits ×1000, padded vocab", 2),
    "07": Stop(("04", "06"), "exact vs Megatron dropout RNG; the TP-aware gradient norm", 1),
    "08": Stop(("04", "07"), "TP × DP grid, broadcasts, DDP buckets, training = serial", 2),
    "09": Stop(("06", "08"), "partial FC and Megatron's way both = serial; their bytes and FLOPs", 2),
    "10": Stop(("05", "08"), "f̄ and ḡ, an SP block and a GPT step = serial; activations ÷ tp", 2),
    "11": Stop(("08", "10"), "every traced byte = the formulas; timelines; α-β pricing", 5),
    "12": Stop(("05", "10"), "GQA, SwiGLU and RoPE under TP and SP = serial; KV replication costs", 3),
    "13": Stop(("06", "11", "12"), "TP decoding = serial tokens; KV cache per rank; decode collectives", 2),
    "14": Stop(("08",), "owned bucket slices; ZeRO-1 = DP × TP; its bytes (16-bit too), memory", 5),
    "15": Stop(("08", "11"), "bfloat16 rounding, 16-bit all-reduce bounds, loss scaling, drift", 2),
    "16": Stop(("10", "11", "12", "14", "15"), "tpsim plan taken apart: bytes per parameter, Table 2, 1F1B", 1),
    "17": Stop(("08", "11", "16"), "AFAB and 1F1B live = serial; in flight m vs min(p − i, m); bubble; p2p bytes", 3),
    "18": Stop(("17",), "interleaving and ZB-H1 live = serial: bubble ÷ v, p2p bytes, activations; the B/W split, a third of the idle", 5),
    "19": Stop(("11", "16", "18"), "a live step on the GPU clock = the planner's, part by part; exposed DP sync, "
                                   "when it hides; the bubble and a published run at real size", 4),
    "20": Stop(("06", "10", "11"), "per-token layers on a shard = serial; the merge = the parallel softmax; zigzag "
                                   "balances causal work; ring, all-gather, Ulysses bytes; a live ring and a "
                                   "CP × TP GPT = serial", 3),
    "21": Stop(("14", "16"), "ZeRO's four stages: bytes per parameter, Figure 1, the owned slices; ZeRO-3 sends 1.5× "
                             "and holds two pieces; ZeRO-1 and ZeRO-2 live = DP × TP", 3),
}

# A one-week course: (day, lessons, what the day is about). Exercises are part of each day.
WEEK: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("Monday", ("01", "02", "03"), "the two splits, f and g, the parallel linear layers"),
    ("Tuesday", ("04", "05", "06"), "a parallel transformer block and its loss"),
    ("Wednesday", ("07", "08", "09"), "dropout and clipping, data × tensor parallelism, the InsightFace way"),
    ("Thursday", ("10", "11", "12", "13"), "sequence parallelism, reading a trace, today's transformer, inference"),
    ("Friday", ("14", "15", "16", "17", "18", "19", "20", "21"),
     "ZeRO-1, 16-bit training, planning a real run, pipelines, their bubble, where the time goes, long sequences, "
     "ZeRO's four stages"),
)


def stop(number: str) -> Stop | None:
    """Lesson ``number``'s place on the path (None for a lesson not yet in the table)."""
    return COURSE.get(number)
