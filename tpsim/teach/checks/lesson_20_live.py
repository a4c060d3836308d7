"""The live part of exercise 20's check: the learner's answers against a ring of ``ContextParallel`` over every
rank of the world (cp = the world size), once every pure answer was right.

Every rank draws the same whole-sequence q, k, v (grouped-query: 4 query heads, 2 KV heads), keeps the tokens
of its zigzag shard and runs the ring forward, traced. Then, on this rank:

    zigzag_chunks(cp_rank, cp)       the chunks whose positions the ring's shard holds (``.positions``)
    merge_partials, folded           over the blocks in the ring's order (its own, then the one of the rank
                                     before it, ...): the ring's output, to 1e-12
    ring_bytes(cp, ...)              the bytes of the sends the ring's forward traced on this rank

Imports MPI (``tpsim.comm``, ``tpsim.cp.context``): ``lesson_20`` loads it only when it gets here.
"""

from __future__ import annotations

import numpy as np

from tpsim.cp.blocks import block_forward, merge
from tpsim.cp.layout import positions
from tpsim.teach.checks.backward import unpack
from tpsim.teach.returned import as_numbers, describe
from tpsim.teach.verdict import Report

B, HEADS, KV_HEADS, D, E = 2, 4, 2, 8, 8  # float64: 8 bytes an element
TOKENS = 8  # per rank: a sequence of 8·cp tokens, two chunks of 4 a rank


def check_live(r: Report) -> None:
    from tpsim.comm import ProcessGrid
    from tpsim.cp.context import ContextParallel

    grid = ProcessGrid(tp=1, dp=1, cp=r.world_size, tracer=r.tracer)
    cp, rank = r.world_size, grid.cp_rank
    ring = ContextParallel(grid.cp_group, comm="ring", layout="zigzag")
    mine = np.asarray(ring.positions(TOKENS))
    seq = TOKENS * cp
    rng = np.random.default_rng(2020)
    q = rng.standard_normal((B, HEADS, seq, D))
    k, v = (rng.standard_normal((B, KV_HEADS, seq, D)) for _ in range(2))
    r.tracer.reset()
    out, _ = ring.forward(q[:, :, mine].copy(), k[:, :, mine].copy(), v[:, :, mine].copy())
    sent = sum(e.wire_bytes for e in r.tracer.events if e.op == "send")
    where = f"the live ring over cp {cp} ({cp} MPI ranks, zigzag, {seq} tokens, grouped-query)"

    got = r.call("zigzag_chunks", rank, cp)
    chunk = seq // (2 * cp)
    held = mine // chunk
    pair = as_numbers(got)
    if isinstance(pair, str) or pair[0].size != 2:
        r.require(False, "zigzag_chunks on the live ring", f"your zigzag_chunks returned {describe(got)}: return "
                                                           "a pair of chunk numbers (early, late)")
    else:
        r.compare(f"zigzag_chunks({rank}, {cp}) against the chunks the positions of {where} fall in",
                  pair[0].reshape(-1), np.unique(held).astype(np.float64), tol=0, layout="rows")

    merged, right = None, True
    for step in range(cp):  # the ring's order: own block, then the block of the rank before, ...
        keys = positions("zigzag", (rank - step) % cp, cp, seq)
        part = block_forward(q[:, :, mine], k[:, :, keys], v[:, :, keys], mine, keys)
        if merged is None:
            merged = part
            continue
        got = r.call("merge_partials", merged[0].copy(), merged[1].copy(), *(x.copy() for x in part))
        mine_merged = folded(r, got, part) if right else None  # every rank makes every call, whatever came back
        right = mine_merged is not None
        merged = mine_merged if right else merge(*merged, *part)
    if right:
        r.compare(f"merge_partials folded over the {cp} K/V blocks in ring order, against the output of {where}",
                  merged[0], out, tol=1e-12)

    got = r.call("ring_bytes", cp, B, seq, HEADS, KV_HEADS, D, E)
    r.compare(f"ring_bytes(cp {cp}, b {B}, s {seq}, heads {HEADS}, kv_heads {KV_HEADS}, head_dim {D}, e {E}) "
              f"against the bytes of the sends traced in the forward of {where}", got, float(sent), tol=0)


def folded(r: Report, got, part) -> tuple | None:
    """The learner's ``(out, lse)`` as arrays of ``part``'s shapes to merge on with; None (and a finding) when it
    is not (the later calls then merge the library's way, only so that every rank calls on)."""
    both = unpack(r, got, ("out", "lse"))
    if both is None:
        return None
    read = [as_numbers(x) for x in both]
    shapes = (part[0].shape, part[1].shape)
    if any(isinstance(x, str) or x[0].shape != s for x, s in zip(read, shapes)):
        r.require(False, "merge_partials on the live ring", f"your merge_partials returned {describe(got)}: "
                                                            "return (out, lse) of the shapes of its inputs")
        return None
    return read[0][0], read[1][0]
