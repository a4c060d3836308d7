"""What a collective pipelined with its GEMM costs (``--tp-comm-overlap``): one rule for the live clock and the planner.

The decomposition is ``tpsim.tp.collective_matmul``'s: a GEMM of ``g`` seconds over the whole sequence splits
into c = t chunks of g/c, one per rank's s/t positions; the collective of ``a`` seconds (its α-β time,
(t − 1)·(α + β·B/t), ``tpsim.cost``) into t − 1 steps of a' = a/(t − 1), one chunk each — a rank's link sends
one chunk at a time, and the GEMM engine runs one chunk at a time, beside it.

**All-gather before the GEMM** (f̄ forward, ḡ backward). The own chunk is here at 0, chunk k after step k:

    transfers   T_k ends at k·a'                       (k = 1 .. t − 1, back to back: all sent data is ready)
    GEMMs       G_0 runs from 0; G_k starts at max(end of G_{k−1}, k·a'), lasts g/c
    end of G_{t−1} = max over j = 0 .. t−1 of (j·a' + (t − j)·g/c)      (the last wait at step j, then t − j GEMMs)

linear in j, so the largest is at an end: j = 0 gives g, j = t − 1 gives a + g/c. Time = max(g, a + g/c).

**GEMM before the reduce-scatter** (ḡ forward, f̄ backward). The chunk for rank r + k is computed k-th and sent
at once; the own chunk is computed last, while the last transfer moves (then the local sum, not priced):

    GEMMs       G_k ends at k·g/c (k = 1 .. t − 1), the own chunk at g
    transfers   T_k ends at max(end of T_{k−1}, k·g/c) + a';  T_{t−1} = max over j = 1 .. t−1 of (j·g/c + (t − j)·a')
    time        max(g, g/c + a, (t − 1)·g/c + a')

and since a' ≥ g/c makes the j = 1 term the larger and a' ≤ g/c makes both ≤ g, again time = max(g, a + g/c):
the two directions cost the same.

So ``pipelined_seconds(a, g, c) = max(g, a + g/c)`` and the collective's **exposed** time, what it adds to the
GEMM, is ``max(g, a + g/c) − g = max(0, a − (c − 1)·g/c)``. It hides fully exactly when a ≤ (c − 1)·g/c, i.e.
a/(t − 1) ≤ g/t: **per-chunk communication no longer than per-chunk compute** — the Ultra-Scale Playbook's
condition for tensor-parallel overlap. Unsplit (c = 1) nothing hides: exposed = a, plain TP's all-reduce, whose
output is the next GEMM's input.

``layer_overlaps`` / ``head_overlaps`` list, per compute action, the collectives a live run pipelines and the
GEMMs beside them (the shapes ``tpsim.tp.collective_matmul`` records), and ``action_seconds`` is the planner's
price of an action's TP rows with them: the rest at their α-β time (``tpsim.plan.comm``), each pipelined one at
its exposed time with the GEMMs' seconds from ``tpsim.plan.timing.gemm_seconds``. Pure arithmetic, no MPI.
"""

from __future__ import annotations

from dataclasses import replace
from typing import NamedTuple

from tpsim.arch.shape import kv_heads_per_rank
from tpsim.cost import wire_bytes
from tpsim.partition import padded_vocab_size
from tpsim.phases import BACKWARD, FORWARD
from tpsim.plan.comm import rows_seconds, ring_seconds
from tpsim.plan.layout import Layout
from tpsim.plan.memory import ACT_BYTES
from tpsim.plan.models import ModelSpec
from tpsim.plan.timing import gemm_seconds


def pipelined_seconds(comm_s: float, gemm_s: float, chunks: int) -> float:
    """Seconds of a collective of ``comm_s`` in ``chunks − 1`` steps beside a GEMM of ``gemm_s`` in ``chunks``
    chunks, first to last: ``max(gemm_s, comm_s + gemm_s / chunks)`` (the module docstring's derivation)."""
    if chunks < 2:
        raise ValueError(f"a collective pipelined in {chunks} chunk(s): it needs at least 2 (tp > 1)")
    return max(gemm_s, comm_s + gemm_s / chunks)


def exposed_seconds(comm_s: float, gemm_s: float, chunks: int) -> float:
    """What the pipelined collective adds to its GEMM: ``pipelined_seconds − gemm_s`` (0 when it hides)."""
    return pipelined_seconds(comm_s, gemm_s, chunks) - gemm_s


def hides(comm_s: float, gemm_s: float, chunks: int) -> bool:
    """The Ultra-Scale Playbook's condition: per-chunk communication ``comm_s / (chunks − 1)`` no longer than
    per-chunk compute ``gemm_s / chunks`` — then ``exposed_seconds`` is 0."""
    return comm_s / (chunks - 1) <= gemm_s / chunks


class Overlap(NamedTuple):
    """One pipelined collective of a compute action: ``predict_step``'s row key (layer, phase, op), its logical
    bytes and the (m, n, k) of each GEMM beside it."""

    layer: str
    phase: str
    op: str
    nbytes: int
    gemms: tuple[tuple[int, int, int], ...]


def _column(layer: str, m: int, k: int, ns: tuple[int, ...], nbytes: int) -> dict[str, list[Overlap]]:
    """A column-parallel layer ``[m, k] · [k, n_i]``: f̄ forward beside x·W_i, f̄ backward beside Σ dy_i·W_iᵀ."""
    return {"F": [Overlap(layer, FORWARD, "all_gather", nbytes, tuple((m, n, k) for n in ns))],
            "B": [Overlap(layer, BACKWARD, "reduce_scatter", nbytes, tuple((m, k, n) for n in ns))]}


def _row(layer: str, m: int, k: int, n: int, nbytes: int) -> dict[str, list[Overlap]]:
    """A row-parallel layer ``[m, k/t] · [k/t, n]``: ḡ forward beside y·B, ḡ backward beside dz·Bᵀ."""
    return {"F": [Overlap(layer, FORWARD, "reduce_scatter", nbytes, ((m, n, k),))],
            "B": [Overlap(layer, BACKWARD, "all_gather", nbytes, ((m, k, n),))]}


def _merge(*parts: dict[str, list[Overlap]], recompute: str = "none") -> dict[str, list[Overlap]]:
    out: dict[str, list[Overlap]] = {"F": [], "B": [], "W": []}
    for part in parts:
        for action, items in part.items():
            out[action] += items
    if recompute == "full":  # the backward repeats the forward, its pipelined collectives with it
        out["B"] += out["F"]
    return out


def sublayer_weights(model: ModelSpec, part: str) -> list[tuple[int, int]]:
    """The full ``[in, out]`` matmul weights of block 0's ``part`` (attention or the MLP) in the architecture's
    own order (``param_shapes``): column-parallel parts that share one f̄ (GPT-2's fused c_attn; Llama's q, k, v),
    then the row-parallel one last (c_proj, o_proj, down_proj)."""
    config = model.config(layers=1)
    prefix = f"{config.layer_names.block}.0.{part}."
    return [s for name, s in config.param_shapes().items() if name.startswith(prefix) and len(s) == 2]


def _sublayer(model: ModelSpec, lay: Layout, part: str, m: int, nbytes: int) -> tuple[dict, dict]:
    """One sublayer's column and row overlaps: each column part keeps out/t columns of its master (a KV
    projection of attention kv_heads_per_rank·d: replicated heads when tp exceeds them), the row part in/t rows."""
    names, t = model.architecture.config.layer_names, lay.tp
    *columns, (rows, out) = sublayer_weights(model, part)
    kv = model.kv_heads * model.head_dim
    ns = tuple(kv_heads_per_rank(model, t) * model.head_dim if part == names.attn and n == kv else n // t
               for _, n in columns)
    layer = f"{names.block}.0.{part}"
    return _column(layer, m, columns[0][0], ns, nbytes), _row(layer, m, rows // t, out, nbytes)


def layer_overlaps(model: ModelSpec, lay: Layout) -> dict[str, list[Overlap]]:
    """``{"F", "B", "W"}``: the collectives one layer pipelines per micro-batch (W: none — dW sums over the
    rows the re-gather brings, so that all-gather stays whole), in the order the layer issues them."""
    names = model.architecture.config.layer_names
    m = lay.micro_batch * lay.local_seq
    nbytes = m * model.hidden * ACT_BYTES[lay.dtype]
    parts = (*_sublayer(model, lay, names.attn, m, nbytes), *_sublayer(model, lay, names.mlp, m, nbytes))
    forward = [o for p in parts for o in p["F"]]
    backward = [o for p in reversed(parts) for o in p["B"]]
    return _merge({"F": forward, "B": backward}, recompute=lay.recompute)


def head_overlaps(model: ModelSpec, lay: Layout) -> dict[str, list[Overlap]]:
    """The LM head's (the last stage's): f̄ beside the logits GEMM [m, h] · [h, V/t], its reduce-scatter beside dh."""
    m = lay.micro_batch * lay.local_seq
    vocab = padded_vocab_size(model.vocab, lay.tp) // lay.tp
    return _merge(_column("lm_head", m, model.hidden, (vocab,), m * model.hidden * ACT_BYTES[lay.dtype]))


def gemms_seconds(gemms, lay: Layout, gpu) -> float:
    """Σ ``gemm_seconds`` of the GEMMs beside one pipelined collective, in order."""
    total = 0.0
    for m, n, k in gemms:
        total += gemm_seconds(m, n, k, lay, gpu)
    return total


def collective_exposed(op: str, nbytes: int, gemms, lay: Layout, gpu, link) -> float:
    """The exposed seconds of one pipelined collective of ``nbytes`` over tp on ``link`` (α-β, ``tpsim.cost``)."""
    return exposed_seconds(ring_seconds(op, nbytes, lay.tp, link), gemms_seconds(gemms, lay, gpu), lay.tp)


def action_seconds(rows, overlaps: list[Overlap], link, lay: Layout, gpu) -> float:
    """One compute action's TP seconds: ``rows`` (``predict_step`` rows, blocking) less one call of each
    pipelined collective at its α-β time, plus each pipelined one's exposed time. ValueError when a pipelined
    collective has no row to come from (the two lists disagree)."""
    left = list(rows)
    for o in overlaps:
        for i, r in enumerate(left):
            if (r.layer, r.phase, r.op, r.group) == (o.layer, o.phase, o.op, "tp") and r.calls:
                left[i] = replace(r, calls=r.calls - 1, bytes=r.bytes - o.nbytes,
                                  wire_bytes=r.wire_bytes - wire_bytes(o.op, o.nbytes, lay.tp))
                break
        else:
            raise ValueError(f"a pipelined {o.op} of {o.layer} ({o.phase}) matches no TP row of the action")
    t = rows_seconds([r for r in left if r.calls != 0], link)
    for o in overlaps:
        t += collective_exposed(o.op, o.nbytes, o.gemms, lay, gpu, link)
    return t


def layer_summary(model: ModelSpec, lay: Layout, gpu, link) -> dict[str, float]:
    """One layer's pipelined collectives for one micro-batch (F and B): ``count``, ``comm_s`` (their α-β time
    unsplit), ``exposed_s`` (what the GEMMs beside them leave) and ``hiding`` (how many meet ``hides``)."""
    out = {"count": 0, "comm_s": 0.0, "exposed_s": 0.0, "hiding": 0}
    for items in layer_overlaps(model, lay).values():
        for o in items:
            a, g = ring_seconds(o.op, o.nbytes, lay.tp, link), gemms_seconds(o.gemms, lay, gpu)
            out["count"] += 1
            out["comm_s"] += a
            out["exposed_s"] += exposed_seconds(a, g, lay.tp)
            out["hiding"] += hides(a, g, lay.tp)
    return out
