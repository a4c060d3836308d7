"""What context parallelism sends: every CP message of one attention layer, one rank, one forward and backward.

One micro-batch of b rows of s tokens, cut over cp ranks (s/cp tokens each); this TP rank holds ``heads`` query
heads and ``kv_heads`` KV heads of ``head_dim`` d, ``e`` bytes an element. One K (or V) shard is
kv = b·kv_heads·(s/cp)·d·e bytes; one Q (or O) shard q = b·heads·(s/cp)·d·e. Group "cp", scope the attention:

    --cp-comm   phase     op           calls      bytes a call     what (``tpsim.cp``)
    ring        forward   send, recv   cp − 1     2·kv             K and V, one ring step each
                backward  send, recv   cp − 1     2·kv             K and V again (the backward recomputes)
                          send, recv   cp         2·kv             dK and dV, travelling with their block and
                                                                   then home to the rank that owns it
    allgather   forward   all_gather   1          2·kv·cp          K and V of the whole sequence
                backward  reduce_scatter 1        2·kv·cp          their gradients, summed, each rank its own
    ulysses     forward   all_to_all   4          q, kv, kv, q     Q, K, V to head shards; O back to sequence
                backward  all_to_all   4          q, q, kv, kv     dO to head shards; dQ, dK, dV back

So per layer a rank sends, forward: ring and allgather (cp − 1)·2·kv (the same bytes: the ring is the all-gather
cut into steps), ulysses (cp − 1)/cp·(2q + 2kv); backward: ring (cp − 1)·2·kv + cp·2·kv, allgather
(cp − 1)·2·kv, ulysses the forward's again. A send's wire bytes are its bytes, a recv's 0; a collective's are
``tpsim.cost.wire_bytes``. GQA: only the KV heads travel (kv_heads < heads shrinks every K/V row).
Pure arithmetic, no MPI.
"""

from __future__ import annotations

from tpsim.cost import wire_bytes
from tpsim.phases import BACKWARD, FORWARD


def cp_messages(comm: str, cp: int, *, b: int, s: int, heads: int, kv_heads: int, head_dim: int,
                e: int) -> list[tuple[str, str, int, int]]:
    """``(phase, op, calls, bytes a call)`` of one attention layer on one rank (the table above); [] at cp 1."""
    if cp == 1:
        return []
    if s % cp:
        raise ValueError(f"sequence {s} does not cut over cp {cp}")
    kv, q = b * kv_heads * (s // cp) * head_dim * e, b * heads * (s // cp) * head_dim * e
    if comm == "ring":
        return [(FORWARD, "send", cp - 1, 2 * kv), (FORWARD, "recv", cp - 1, 2 * kv),
                (BACKWARD, "send", cp - 1, 2 * kv), (BACKWARD, "recv", cp - 1, 2 * kv),
                (BACKWARD, "send", cp, 2 * kv), (BACKWARD, "recv", cp, 2 * kv)]
    if comm == "allgather":
        return [(FORWARD, "all_gather", 1, 2 * kv * cp), (BACKWARD, "reduce_scatter", 1, 2 * kv * cp)]
    if comm == "ulysses":
        return ([(FORWARD, "all_to_all", 1, n) for n in (q, kv, kv, q)]
                + [(BACKWARD, "all_to_all", 1, n) for n in (q, q, kv, kv)])
    raise ValueError(f"unknown --cp-comm {comm!r}")


def cp_layer_bytes(comm: str, cp: int, **sizes) -> dict[str, int]:
    """``{"forward": wire bytes, "backward": wire bytes}`` one rank sends in one attention layer (``cp_messages``)."""
    out = {FORWARD: 0, BACKWARD: 0}
    for phase, op, calls, nbytes in cp_messages(comm, cp, **sizes):
        out[phase] += calls * wire_bytes(op, nbytes, cp)
    return out
