"""The check of exercise 20: the online-softmax merge of two partial attentions, the zigzag layout's chunks, and
the bytes ring attention sends forward (lesson 20, context parallelism).

1. ``merge_partials(out_a, lse_a, out_b, lse_b)`` on every rank, with that rank's queries of a zigzag sequence
   over cp 4 (``tpsim.cp.layout``): block a its own keys, block b the keys of the rank before it on the ring, so
   some query rows see nothing of block b (lse −∞ there). Once with the scores as they come, once with every
   score + 1000 (both lse + 1000, the outputs unchanged), where an exp of an lse overflows. The expected values
   are the attention of the queries over both blocks at once (``block_forward`` on the keys put together), not
   the library's merge: lse first, then out.
2. ``zigzag_chunks(rank, cp)`` for every rank of cp 2, 3, 4, 8, as one [ranks, 2] table of rows on rank 0.
3. ``ring_bytes(cp, b, s, heads, kv_heads, head_dim, e)`` on sizes with and without grouped-query attention, one
   vector on the next rank, against ``tpsim.predict.cp_comm.cp_layer_bytes("ring", ...)["forward"]``.
4. If every answer was right on every rank, they are held to a live ring of ``ContextParallel`` over the world
   (``lesson_20_live``).

Every process makes every call (a call is collective); each vector is compared by one process, so each finding
is reported once. Each typical slip is written out below as what it returns (``tpsim.teach.diagnose``).
"""

from __future__ import annotations

import numpy as np

from tpsim.cp.blocks import block_forward
from tpsim.cp.layout import positions
from tpsim.predict.cp_comm import cp_layer_bytes
from tpsim.teach.checks.backward import unpack
from tpsim.teach.checks.registry import exercise
from tpsim.teach.returned import as_numbers, describe
from tpsim.teach.verdict import BROKE, FOUND, OK, WRONG, Report, Stop

# --- slips of merge_partials: its lse ---------------------------------------------------------------------------
MAX_NOT_LSE = ("your lse is the larger of the two: the max is only the shift that keeps the exponentials finite; "
               "the merged lse is the log of both blocks' sums of exponentials together, which is more than either")
LSE_ADDED = ("you added the two lse: a sum of logs is the log of a product, and the two blocks' sums of "
             "exponentials add up, they do not multiply")
LSE_OVERFLOW = ("your lse overflows when the scores are large: exp of a ×1000-sized lse is inf in float64 — the "
                "article's global max is there to prevent exactly that")
# --- slips of merge_partials: its out ---------------------------------------------------------------------------
UNWEIGHTED = ("your out is out_a + out_b: each partial output is already normalised over its own keys, so the "
              "two must be weighted by their shares of the merged sum of exponentials")
AVERAGED = ("your out is the mean of the two partial outputs: you forgot to rescale them — a block that holds more "
            "of the probability must weigh more than one half")
NOT_DIVIDED = ("your out weighs each side by its exponentials rescaled to the global max, but never divides by the "
               "global sum of exponentials, so the two weights do not add up to 1")
RAW_WEIGHTS = ("your out weighs each side by exp(lse_side) itself: those are the sums of exponentials, not yet "
               "divided by their total, so the weights do not add up to 1")
SWAPPED = ("your weights are swapped: out_a carries block b's share of the probability and out_b block a's")
WINNER = ("your out is the output of the side with the larger lse alone: the other block's keys still carry "
          "their share of the probability")
OUT_OVERFLOW = ("your out is not finite when the scores are large: exp of a ×1000-sized lse overflows and inf / inf "
                "is NaN — the article's global max is there to prevent exactly that")
# --- slips of zigzag_chunks ---------------------------------------------------------------------------------------
MIRROR_2CP = ("your second chunk is 2·cp − r: the chunks are numbered 0 … 2·cp − 1, so rank 0's runs past the end "
              "and no rank holds the last chunk")
CP_PLUS_R = ("your second chunk is cp + r: an early chunk paired with a later one at the same offset, so the late "
             "ranks still hold the late chunks and do the most causal work")
CONTIGUOUS = ("yours are chunks 2r and 2r + 1, side by side: that is the contiguous layout cut finer, and the "
              "last rank still does about 2·cp − 1 times the first one's causal work")
MIRROR_HALF = ("your second chunk is cp − 1 − r: a mirror image within the first half, so the second half of the "
               "sequence is held by nobody")
LATE_FIRST = ("your pair has the late chunk first: a rank holds its tokens in sequence order, the earlier chunk "
              "first")
ONE_BASED = "your chunks are numbered from 1: chunk numbers start at 0, like the ranks"
# --- slips of ring_bytes -----------------------------------------------------------------------------------------
CP_STEPS = ("you counted one ring step too many: a rank holds its own K/V block before the first step, and only the "
            "blocks it passes on are sent")
NO_V = "you sent K only: every ring step passes the block's K and its V, two tensors of the same size"
QUERY_HEADS = ("your K/V block has the query heads: under grouped-query attention only the kv_heads key/value "
               "heads travel, the query heads stay home")
WHOLE_SEQUENCE = "your block is the whole sequence's K/V: a rank passes on one shard of the sequence a step"
ELEMENTS = "yours counts elements: multiply by e, the bytes an element"
WITH_BACKWARD = ("you counted the backward too (the blocks again, and their gradients sent home): the question is "
                 "the forward's sends alone")
RECV_COUNTED = ("you counted what a rank receives as well as what it sends: each step sends one block and "
                "receives one, and only the send's bytes leave the rank")

SEQ, B, HEADS, D = 32, 2, 3, 5  # the merge's queries: a zigzag shard of 32 tokens over cp 4
LARGE = 1000.0  # every score + 1000: lse + 1000, out unchanged
ZIGZAG_CPS = (2, 3, 4, 8)
# (cp, b, s, heads, kv_heads, head_dim, e): GQA and not, odd sizes, fp32 and bf16
RING_CASES = [(2, 1, 16, 4, 4, 8, 4), (4, 2, 64, 8, 2, 16, 2), (8, 1, 128, 32, 8, 128, 2), (3, 3, 24, 6, 3, 5, 4),
              (4, 1, 8192, 32, 8, 128, 2), (8, 2, 64, 4, 1, 32, 4), (2, 4, 2048, 16, 16, 64, 2),
              (16, 1, 131072, 64, 8, 128, 2)]


def merge_inputs(rank: int, cp: int, seed: int = 20) -> tuple[tuple, tuple]:
    """``((out_a, lse_a, out_b, lse_b), (out, lse))``: rank's zigzag queries against its own keys (a) and the
    keys of the rank before it on the ring (b); the answer is the attention over both blocks at once."""
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal((B, HEADS, SEQ, D)) * 1.5 for _ in range(3))
    mine, before = positions("zigzag", rank, cp, SEQ), positions("zigzag", (rank - 1) % cp, cp, SEQ)
    out_a, lse_a = block_forward(q[:, :, mine], k[:, :, mine], v[:, :, mine], mine, mine)
    out_b, lse_b = block_forward(q[:, :, mine], k[:, :, before], v[:, :, before], mine, before)
    keys = np.concatenate([mine, before])
    out, lse = block_forward(q[:, :, mine], k[:, :, keys], v[:, :, keys], mine, keys)
    return (out_a, lse_a, out_b, lse_b), (out, lse)


def lse_symptoms(lse_a, lse_b) -> dict:
    with np.errstate(all="ignore"):
        return {MAX_NOT_LSE: np.maximum(lse_a, lse_b), LSE_ADDED: lse_a + lse_b,
                LSE_OVERFLOW: np.log(np.exp(lse_a) + np.exp(lse_b))}


def out_symptoms(out_a, lse_a, out_b, lse_b) -> dict:
    def weighted(wa, wb):
        return wa[..., None] * out_a + wb[..., None] * out_b

    with np.errstate(all="ignore"):
        top = np.maximum(lse_a, lse_b)
        ea, eb = np.exp(lse_a), np.exp(lse_b)
        sa, sb = np.exp(lse_a - top), np.exp(lse_b - top)
        a_wins = (lse_a >= lse_b)[..., None]
        return {UNWEIGHTED: out_a + out_b, AVERAGED: (out_a + out_b) / 2, NOT_DIVIDED: weighted(sa, sb),
                RAW_WEIGHTS: weighted(ea, eb), SWAPPED: weighted(sb / (sa + sb), sa / (sa + sb)),
                WINNER: np.where(a_wins, out_a, out_b), OUT_OVERFLOW: weighted(ea / (ea + eb), eb / (ea + eb))}


def zigzag_table() -> list[tuple[int, int]]:
    """Every (rank, cp) the check asks about, in order."""
    return [(rank, cp) for cp in ZIGZAG_CPS for rank in range(cp)]


def zigzag_symptoms() -> dict:
    def each(fn):
        return np.array([fn(r, c) for r, c in zigzag_table()], dtype=np.float64)

    return {MIRROR_2CP: each(lambda r, c: (r, 2 * c - r)), CP_PLUS_R: each(lambda r, c: (r, c + r)),
            CONTIGUOUS: each(lambda r, c: (2 * r, 2 * r + 1)), MIRROR_HALF: each(lambda r, c: (r, c - 1 - r)),
            LATE_FIRST: each(lambda r, c: (2 * c - 1 - r, r)), ONE_BASED: each(lambda r, c: (r + 1, 2 * c - r))}


def reference_ring(cp, b, s, heads, kv_heads, head_dim, e) -> int:
    return cp_layer_bytes("ring", cp, b=b, s=s, heads=heads, kv_heads=kv_heads, head_dim=head_dim, e=e)["forward"]


def ring_symptoms() -> dict:
    def each(fn):
        return np.array([fn(cp, b * kv * (s // cp) * d * e, heads / kv, e) for cp, b, s, heads, kv, d, e in
                         RING_CASES], dtype=np.float64)

    return {CP_STEPS: each(lambda cp, block, g, e: cp * 2 * block),
            NO_V: each(lambda cp, block, g, e: (cp - 1) * block),
            QUERY_HEADS: each(lambda cp, block, g, e: (cp - 1) * 2 * block * g),
            WHOLE_SEQUENCE: each(lambda cp, block, g, e: (cp - 1) * 2 * block * cp),
            ELEMENTS: each(lambda cp, block, g, e: (cp - 1) * 2 * block / e),
            WITH_BACKWARD: each(lambda cp, block, g, e: (cp - 1) * 4 * block + cp * 2 * block),
            RECV_COUNTED: each(lambda cp, block, g, e: (cp - 1) * 4 * block)}


def numbers_of(answers: list, size: int, whats: list[str], r: Report, allowed: str) -> np.ndarray | None:
    """Every answer as ``size`` floats, stacked, or None after one finding on the first that is not."""
    rows = []
    for got, what in zip(answers, whats):
        numbers = as_numbers(got)
        if isinstance(numbers, str) or numbers[0].size != size:
            r.require(False, what, f"your {r.function} returned {describe(got)}: return {allowed}")
            return None
        rows.append(numbers[0].reshape(-1))
    return np.array(rows)


def check_merge(r: Report) -> None:
    cp = max(r.world_size, 2)
    (out_a, lse_a, out_b, lse_b), (out, lse) = merge_inputs(r.rank % cp, cp)
    cases = [((out_a, lse_a + shift, out_b, lse_b + shift), shift, how)
             for shift, how in ((0.0, "the scores as they come"), (LARGE, "every score + 1000"))]
    answers = [r.call("merge_partials", *(x.copy() for x in args)) for args, _, _ in cases]  # every rank, every call
    for got, (args, shift, how) in zip(answers, cases):
        got = unpack(r, got, ("out", "lse"))
        if got is None:
            return
        what = (f"merge_partials of rank {r.rank % cp}'s {SEQ // cp} zigzag queries over its own keys and the "
                f"previous rank's ({how}; {int(np.isinf(lse_b).sum())} rows see no key of block b)")
        r.compare(f"the lse of {what}", got[1], lse + shift, tol=1e-10, symptoms=lse_symptoms(args[1], args[3]))
        r.compare(f"the out of {what}", got[0], out, tol=1e-12, symptoms=out_symptoms(*args))


def check_zigzag(r: Report) -> None:
    got = [r.call("zigzag_chunks", rank, cp) for rank, cp in zigzag_table()]
    if r.rank != 0:
        return
    rows = numbers_of(got, 2, [f"zigzag_chunks({rank}, {cp})" for rank, cp in zigzag_table()], r,
                      "a pair of chunk numbers (early, late)")
    if rows is not None:
        right = np.array([(rank, 2 * cp - 1 - rank) for rank, cp in zigzag_table()], dtype=np.float64)
        r.compare(f"zigzag_chunks(rank, cp) for every rank of cp {', '.join(map(str, ZIGZAG_CPS))}, one row "
                  "(early, late) each", rows, right, tol=0, symptoms=zigzag_symptoms(), layout="rows")


def check_ring(r: Report) -> None:
    got = [r.call("ring_bytes", *case) for case in RING_CASES]
    if r.rank != min(1, r.world_size - 1):
        return
    values = numbers_of(got, 1, [f"ring_bytes{case}" for case in RING_CASES], r, "a number of bytes (an int)")
    if values is not None:
        right = np.array([reference_ring(*case) for case in RING_CASES], dtype=np.float64)
        r.compare(f"ring_bytes on {len(RING_CASES)} sizes (cp, b, s, heads, kv_heads, head_dim, e), one value "
                  "each, against the ring's forward sends", values.reshape(-1), right, tol=0,
                  symptoms=ring_symptoms())


@exercise("20", "merge_partials", "zigzag_chunks", "ring_bytes",
          merge_partials=("lesson 06's parallel softmax: a global max of the two lse, each side's sum of "
                          "exponentials rescaled to it, then a global sum; what share of the merged sum does each "
                          "side's keys carry?",
                          "with m = max(lse_a, lse_b): lse = m + log(exp(lse_a − m) + exp(lse_b − m)); each side's "
                          "weight is exp(lse_side − lse), and the two weights add up to 1",
                          "m = np.maximum(lse_a, lse_b); wa, wb = np.exp(lse_a − m), np.exp(lse_b − m); "
                          "return (wa/(wa+wb))[..., None]·out_a + (wb/(wa+wb))[..., None]·out_b, m + np.log(wa+wb)"),
          zigzag_chunks=("cut the sequence into 2·cp chunks; under the causal mask a late chunk's queries see many "
                         "keys and an early one's few: which late chunk makes up for early chunk r?",
                         "chunk c's queries see about c + ½ chunks of keys; a pair (r, x) is balanced for every r "
                         "when r + x is the same for every rank, the largest possible: 2·cp − 1",
                         "return rank, 2 * cp − 1 − rank"),
          ring_bytes=("one ring step sends this rank's current K/V block to the next rank: how big is a block, "
                      "and how many steps until every rank has seen every block?",
                      "a block is K and V of s / cp tokens, b rows, kv_heads heads of head_dim, e bytes each; the "
                      "rank's own block needs no step, so there are cp − 1 sends",
                      "return (cp − 1) · 2 · b · kv_heads · (s // cp) · head_dim · e"))
def check_20(r: Report) -> None:
    check_merge(r)
    check_zigzag(r)
    check_ring(r)
    agreed = r.agree_on(OK)
    if agreed[BROKE]:
        raise Stop(WRONG, "")
    if agreed[FOUND]:
        return
    from tpsim.teach.checks.lesson_20_live import check_live  # MPI: only once every answer is right
    check_live(r)
