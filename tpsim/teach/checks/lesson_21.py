"""The check of exercise 21: the bytes per parameter of ZeRO's four stages, an owned slice of a padded bucket and
its padding, and the wire bytes of a ZeRO-3 step (lesson 21, ZeRO's stages side by side).

1. ``bytes_per_param(stage, d)`` for stages 0–3 at d = 1, 2, 3, 4, 8, 64, one vector on rank 0, against
   ``StateLayout.bytes_per_zero_stage`` of the paper's 2 + 2 + K layout (Rajbhandari et al. 2019, §5, K = 12).
2. ``owned_slice(n, d, rank)`` for every rank of awkward buckets, one [calls, 3] table of rows on the next rank,
   against ``tpsim.partition.owned_range`` and the padded positions [n, ⌈n/d⌉·d).
3. ``zero3_step_bytes(params, d, e)`` on sizes d divides and does not, one vector on the rank after, against the
   ring's bytes of two all-gathers and one reduce-scatter of the padded buffer (``tpsim.cost.wire_bytes``).
4. If every answer was right on every rank, they are held to a live ZeRO-1 over the world and a ZeRO-2's
   gradients at rest (``lesson_21_live``).

Every process makes every call (a call is collective); each vector is compared by one process, so each finding
is reported once. Each typical slip is written out below as what it returns (``tpsim.teach.diagnose``).
"""

from __future__ import annotations

import numpy as np

from tpsim.cost import wire_bytes
from tpsim.partition import owned_range, padded_length
from tpsim.predict.model_state import StateLayout
from tpsim.teach.checks.lesson_20 import numbers_of
from tpsim.teach.checks.registry import exercise
from tpsim.teach.verdict import BROKE, FOUND, OK, WRONG, Report, Stop

# --- slips of bytes_per_param ----------------------------------------------------------------------------------
PARAMS_AT_2 = ("your stage 2 divides the fp16 parameters by d too: P_os+g shards the gradients and the optimizer "
               "state, and every rank still keeps the whole model's parameters for its forward")
GRADS_AT_1 = ("your stage 1 shards the gradients: P_os cuts only the optimizer state into d slices; the whole "
              "gradient stays on every rank until stage 2")
OPTIMIZER_WHOLE = ("your optimizer state is 12 bytes at every stage: from stage 1 on it is 12/d, each rank "
                   "keeping the fp32 master copy and the moments of its own slice only")
FP32_GRADS = ("you counted 4-byte gradients (Megatron's bf16 recipe, fp32 main gradients): the paper's "
              "accounting has 2-byte fp16 gradients, 2 + 2 + K")
NO_MASTER = ("your optimizer state is 8 bytes, Adam's two moments alone: K = 12 counts the fp32 master copy of "
             "the parameter too")
THREE_AS_TWO = ("your stage 3 keeps the fp16 parameters whole, as stage 2 does: P_os+g+p shards them as well, "
                "each rank gathering a layer's parameters only while it computes with them")
TWO_AS_ONE = ("your stage 2 keeps the gradients whole, as stage 1 does: P_os+g reduce-scatters each gradient "
              "bucket into the owned slices and frees the rest")
SHARDED_AT_0 = ("your stage 0 shards the optimizer state already: stage 0 is plain data parallelism, every rank "
                "holding all 16 bytes")
# --- slips of owned_slice --------------------------------------------------------------------------------------
ROUNDED_DOWN = ("your slices are ⌊n/d⌋ long: rounding down leaves the last n mod d elements to nobody; round up "
                "to ⌈n/d⌉ and pad the bucket to ⌈n/d⌉·d")
REMAINDER = ("your last rank took the remainder: a reduce-scatter needs d equal slices, so the bucket is padded "
             "to a multiple of d instead")
CLIPPED = ("your ranges were cut off at n: the padding is owned too, so every slice is as long as the others "
           "(one past the end holds only padding)")
INCLUSIVE = "your stop is the last position the rank owns: [start, stop) excludes the stop, as a Python slice does"
PAD_EVERYWHERE = ("your padding is the whole bucket's on every rank: the padded positions are the end of the "
                  "bucket, [n, ⌈n/d⌉·d), so only the slices that reach past n hold any")
PAD_IN_FRONT = ("your padding is on rank 0: the zeros are appended after the last element, so they fall into "
                "the last slices, not the first")
REAL_COUNTED = ("your third number counts the rank's real elements: it should count its padded positions, the "
                "ones that belong to no parameter")
PLUS_ONE = ("your slices are n // d + 1 long even when d divides n: that pads a bucket that needs no padding; "
            "⌈n/d⌉ is n // d only then")
# --- slips of zero3_step_bytes ---------------------------------------------------------------------------------
ONE_GATHER = ("you counted one all-gather: ZeRO-3 frees each layer's gathered parameters after its forward and "
              "gathers them again before its backward, so it sends 1.5 times DDP's bytes, not DDP's")
ALL_REDUCE_EACH = ("you priced each collective as an all-reduce, 2(d − 1)/d of the buffer: an all-gather and a "
                   "reduce-scatter each send (d − 1)/d, half an all-reduce")
NO_PADDING = ("you left out the padding: each collective moves d − 1 shards of ⌈params/d⌉ elements, the buffer "
              "padded to a multiple of d")
WHOLE_BUFFER = ("you sent the whole padded buffer in each collective: a ring passes on d − 1 of its d shards, "
                "(d − 1)/d of the buffer")
ELEMENTS = "yours counts elements: multiply by e, the bytes an element"
ONE_SHARD = ("you sent one shard per collective: a ring all-gather (or reduce-scatter) passes d − 1 shards through "
             "every rank")
NOT_DIVIDED = "you multiplied the buffer by d − 1 without dividing by d: each rank sends (d − 1)/d of it"

STAGE_CASES = [(stage, d) for d in (1, 2, 3, 4, 8, 64) for stage in range(4)]
# (n, d): a multiple of d first (inclusive stops and one-too-long slices show there), then not a multiple, shorter
# than d, d = 1, empty, a bucket whose padding spills into two slices (5 over 4: 3 padded positions)
SLICE_CASES = [(16, 4), (13, 4), (10, 4), (5, 4), (7, 8), (1, 3), (100, 1), (11, 3), (1001, 8), (0, 2)]
# (params, d, e): d divides params and not, d = 1, fp16 / fp32 / fp64
ZERO3_CASES = [(1000, 4, 2), (1003, 4, 2), (10, 3, 4), (7, 8, 8), (124_000_000, 64, 2), (5, 1, 4), (999, 2, 8),
               (7_500_000_001, 64, 2)]
PAPER = StateLayout("the ZeRO paper: fp16 params and grads, K = 12", 2, 2, 0, 0, 12)


def paper_bytes(stage: int, d: int, p: float = 2, g: float = 2, k: float = 12, shard=(1, 2, 3)) -> float:
    """Bytes per parameter with p, g, k bytes of parameter, gradient and optimizer state, the optimizer sharded
    from stage ``shard[0]``, the gradients from ``shard[1]``, the parameters from ``shard[2]``."""
    return (p / d if stage >= shard[2] else p) + (g / d if stage >= shard[1] else g) + \
        (k / d if stage >= shard[0] else k)


def stage_symptoms() -> dict:
    def each(**kw):
        return np.array([paper_bytes(s, d, **kw) for s, d in STAGE_CASES])

    return {PARAMS_AT_2: each(shard=(1, 2, 2)), GRADS_AT_1: each(shard=(1, 1, 3)),
            OPTIMIZER_WHOLE: each(shard=(4, 2, 3)), FP32_GRADS: each(g=4), NO_MASTER: each(k=8),
            THREE_AS_TWO: each(shard=(1, 2, 4)), TWO_AS_ONE: each(shard=(1, 3, 3)), SHARDED_AT_0: each(shard=(0, 2, 3))}


def slice_table() -> list[tuple[int, int, int]]:
    """Every (n, d, rank) the check asks about, in order."""
    return [(n, d, rank) for n, d in SLICE_CASES for rank in range(d)]


def right_slice(n: int, d: int, rank: int) -> tuple[int, int, int]:
    mine = owned_range(n, d, rank)
    return mine.start, mine.stop, len(set(mine) & set(range(n, padded_length(n, d))))


def slice_symptoms() -> dict:
    def each(fn):
        return np.array([fn(n, d, r) for n, d, r in slice_table()], dtype=np.float64).reshape(-1, 3)

    def floor(n, d, r):
        return r * (n // d), (r + 1) * (n // d), 0

    def padded(n, d, r, shard):
        lo, hi = r * shard, (r + 1) * shard
        return lo, hi, max(0, hi - max(lo, n))

    def clipped(n, d, r):
        lo, hi, _ = right_slice(n, d, r)
        return min(lo, n), min(hi, n), 0

    return {ROUNDED_DOWN: each(floor),
            REMAINDER: each(lambda n, d, r: floor(n, d, r)[:1] + ((n if r == d - 1 else (r + 1) * (n // d)), 0)),
            CLIPPED: each(clipped),
            INCLUSIVE: each(lambda n, d, r: np.subtract(right_slice(n, d, r), (0, 1, 0))),
            PAD_EVERYWHERE: each(lambda n, d, r: right_slice(n, d, r)[:2] + (padded_length(n, d) - n,)),
            PAD_IN_FRONT: each(lambda n, d, r: right_slice(n, d, r)[:2] + (  # the zeros [0, n_pad − n) instead
                min(-(-n // d), max(0, padded_length(n, d) - n - r * -(-n // d))),)),
            REAL_COUNTED: each(lambda n, d, r: right_slice(n, d, r)[:2] + (
                padded_length(n, d) // d - right_slice(n, d, r)[2],)),
            PLUS_ONE: each(lambda n, d, r: padded(n, d, r, n // d + 1))}


def right_zero3(params: int, d: int, e: int) -> int:
    """Two all-gathers (before the forward, before the backward) and a reduce-scatter of the padded buffer."""
    buffer = padded_length(params, d) * e
    return 2 * wire_bytes("all_gather", buffer, d) + wire_bytes("reduce_scatter", buffer, d)


def zero3_symptoms() -> dict:
    def each(fn):
        return np.array([fn(params, d, e, -(-params // d)) for params, d, e in ZERO3_CASES], dtype=np.float64)

    return {ONE_GATHER: each(lambda p, d, e, s: 2 * (d - 1) * s * e),
            ALL_REDUCE_EACH: each(lambda p, d, e, s: 6 * (d - 1) * s * e),
            NO_PADDING: each(lambda p, d, e, s: 3 * (d - 1) * p * e / d),
            WHOLE_BUFFER: each(lambda p, d, e, s: 3 * d * s * e),
            ELEMENTS: each(lambda p, d, e, s: 3 * (d - 1) * s),
            ONE_SHARD: each(lambda p, d, e, s: 3 * s * e),
            NOT_DIVIDED: each(lambda p, d, e, s: 3 * (d - 1) * d * s * e)}


def check_stages(r: Report) -> None:
    got = [r.call("bytes_per_param", stage, d) for stage, d in STAGE_CASES]
    if r.rank != 0:
        return
    values = numbers_of(got, 1, [f"bytes_per_param({s}, {d})" for s, d in STAGE_CASES], r, "a number of bytes")
    if values is not None:
        right = np.array([float(PAPER.bytes_per_zero_stage(s, d)) for s, d in STAGE_CASES])
        r.compare(f"bytes_per_param(stage, d) for stages 0–3 at d = 1, 2, 3, 4, 8, 64 ({len(STAGE_CASES)} values, "
                  "stage fastest)", values.reshape(-1), right, tol=1e-9, symptoms=stage_symptoms())


def check_slices(r: Report) -> None:
    got = [r.call("owned_slice", n, d, rank) for n, d, rank in slice_table()]
    if r.rank != min(1, r.world_size - 1):
        return
    rows = numbers_of(got, 3, [f"owned_slice({n}, {d}, {rank})" for n, d, rank in slice_table()], r,
                      "three whole numbers (start, stop, padding)")
    if rows is not None:
        right = np.array([right_slice(*case) for case in slice_table()], dtype=np.float64)
        r.compare(f"owned_slice(n, d, rank) for every rank of {len(SLICE_CASES)} buckets (n, d), one row (start, "
                  "stop, padding) each", rows, right, tol=0, symptoms=slice_symptoms(), layout="rows")


def check_zero3(r: Report) -> None:
    got = [r.call("zero3_step_bytes", *case) for case in ZERO3_CASES]
    if r.rank != min(2, r.world_size - 1):
        return
    values = numbers_of(got, 1, [f"zero3_step_bytes{case}" for case in ZERO3_CASES], r, "a number of bytes (an int)")
    if values is not None:
        right = np.array([right_zero3(*case) for case in ZERO3_CASES], dtype=np.float64)
        r.compare(f"zero3_step_bytes on {len(ZERO3_CASES)} sizes (params, d, e), one value each, against the ring's "
                  "bytes of a ZeRO-3 step", values.reshape(-1), right, tol=0, symptoms=zero3_symptoms())


@exercise("21", "bytes_per_param", "owned_slice", "zero3_step_bytes",
          bytes_per_param=("a parameter costs 2 + 2 + 12 bytes (fp16 parameter, fp16 gradient, fp32 master copy and "
                           "moments); each stage cuts one more of the three into d slices: which, in which order?",
                           "stage 1 divides the 12 by d, stage 2 the gradient's 2 as well, stage 3 the parameter's 2 "
                           "too: 16, 4 + 12/d, 2 + 14/d, 16/d",
                           "return (2 / d if stage >= 3 else 2) + (2 / d if stage >= 2 else 2) + "
                           "(12 / d if stage >= 1 else 12)"),
          owned_slice=("pad the bucket up to the next multiple of d, cut it into d equal slices: where are the "
                       "padded positions?",
                       "shard = ⌈n/d⌉; rank r owns [r·shard, (r + 1)·shard); the padding is [n, shard·d), the "
                       "end of the bucket, so count how much of it overlaps the rank's slice",
                       "start, stop = r·shard, (r + 1)·shard; return start, stop, max(0, stop − max(start, n))"),
          zero3_step_bytes=("list the step's DP collectives under ZeRO-3: the parameters are sharded, so they must "
                            "be gathered before each use, and the gradients end up sharded",
                            "an all-gather before the forward, another before the backward, a reduce-scatter after "
                            "it; each sends d − 1 shards of ⌈params/d⌉ elements",
                            "return 3 · (d − 1) · ⌈params/d⌉ · e"))
def check_21(r: Report) -> None:
    check_stages(r)
    check_slices(r)
    check_zero3(r)
    agreed = r.agree_on(OK)
    if agreed[BROKE]:
        raise Stop(WRONG, "")
    if agreed[FOUND]:
        return
    from tpsim.teach.checks.lesson_21_live import check_live  # MPI: only once every answer is right
    check_live(r)
