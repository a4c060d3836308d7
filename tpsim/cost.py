"""What a collective costs: the bytes one rank puts on the wire, and the α-β time of the ring algorithm.

Pure arithmetic (no MPI): the traced ``Group`` records ``wire_bytes`` for every call, and the formulas, the
link presets and the planner price collectives with ``ring_time``.

For a group of ``p`` ranks and a collective whose full logical tensor is ``B`` bytes
(all_reduce: the buffer; all_gather: the gathered output; reduce_scatter: the unreduced input;
broadcast: the buffer), the bandwidth-optimal algorithms send, per rank:

    all_reduce      2 (p - 1) / p * B     ring reduce-scatter followed by ring all-gather
    all_gather        (p - 1) / p * B     each rank forwards the p - 1 chunks it does not own
    reduce_scatter    (p - 1) / p * B     the mirror image of all_gather
    broadcast                   B         pipelined chain: every rank but the last forwards the whole
                                          buffer once; we report the busiest rank (0 when p == 1)
    gather            (p - 1) / p * B     the root receives; we report what the p - 1 senders send in all / p
    send                        B         point-to-point (a pipeline's activation or gradient): the sender
    recv                        0         sends the whole message once, the receiver sends nothing

The α-β model prices one collective as ``ring_steps·α + wire_bytes·β`` (``alpha_beta_time``; α the latency
of one ring step, β the seconds per byte one rank sends). The measured traffic of a real MPI library can differ
(it may pick a tree for small messages); the logical size cannot.
"""

from __future__ import annotations


def wire_bytes(op: str, nbytes: int, p: int) -> int:
    """Bytes one rank sends for collective ``op`` on a ``nbytes`` logical tensor in a group of ``p`` ranks."""
    if p <= 1:
        return 0
    if op == "all_reduce":
        return 2 * (p - 1) * nbytes // p
    if op in ("all_gather", "reduce_scatter", "gather", "all_to_all"):  # all_to_all: keeps 1/p of its own
        return (p - 1) * nbytes // p
    if op == "broadcast":
        return nbytes
    if op == "barrier":
        return 0
    if op == "send":  # point-to-point: the sender sends the whole message, the receiver nothing
        return nbytes
    if op == "recv":
        return 0
    raise ValueError(f"unknown collective {op!r}")


def ring_steps(op: str, p: int) -> int:
    """Latency steps of the ring algorithm: all_reduce 2(p−1); all_gather, reduce_scatter, gather and broadcast
    (a pipelined chain) p−1; nothing to wait for when p == 1."""
    if p <= 1:
        return 0
    if op in ("send", "recv"):  # one message, one latency
        return 1
    return 2 * (p - 1) if op == "all_reduce" else p - 1


def alpha_beta_time(steps: int, wire: int, alpha: float, beta: float, total: float = 0.0) -> float:
    """The α-β model, written once: ``total`` + ``steps`` latency steps of ``alpha`` seconds each + ``wire`` bytes
    sent at ``beta`` seconds a byte (1 / bandwidth per rank per direction).

    ``total`` lets a running sum over a step's collectives (``tpsim.predict.hardware``) add the two terms one
    after the other, as it always has, so its seconds stay the same to the last bit.
    """
    return total + steps * alpha + wire * beta


def ring_time(op: str, nbytes: int, p: int, alpha: float, beta: float) -> float:
    """Seconds for one collective on a ``nbytes`` logical tensor over ``p`` ranks: steps·α + wire_bytes·β.

    ``alpha``: per-step latency, seconds; ``beta``: seconds per byte (1 / bandwidth per rank per direction).
    """
    return alpha_beta_time(ring_steps(op, p), wire_bytes(op, nbytes, p), alpha, beta)
