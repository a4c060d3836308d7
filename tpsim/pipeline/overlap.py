"""DP communication beside compute: the cost rule of the comm stream, one pure function for the live clock and
the planner (``tpsim.live_pipeline.clock``, ``tpsim.plan.dp_overlap``), so both price ``--overlap-grad-reduce`` (and
ZeRO-2's per-micro-batch reduce-scatters: ``zero2_stream``) alike.

Each rank has two streams. The compute stream runs the schedule's actions; an action's charged cost is spread
over its *pieces* in execution order (``backward_pieces``, ``forward_pieces``):

    backward (B or W)   the LM head (last virtual stage only), its layers last to first, the embedding (first
                        virtual stage; it costs 0)
    forward (F)         the reverse: the embedding, the layers first to last, the LM head

each piece costing its own compute seconds plus the α-β time of the TP collectives traced inside it, so
``piece_ends(start, seconds)`` are the running sums from the action's start. A DP gradient bucket is *ready* at
the end of the piece that produced its last gradient in the last micro-batch's backward. The comm stream runs
the buckets in issue order, each from max(its ready time, the previous bucket's end), for its α-β time on the
DP link (``comm_stream``); before the optimizer the compute clock waits for it:

    start_i = max(ready_i, end_{i-1}),   end_i = start_i + t_i,   clock = max(compute end, end_last)
    exposed DP communication = clock − compute end          hidden = Σ t_i − exposed

Without ``--overlap-grad-reduce`` every bucket is ready at the compute end: all of it is exposed. The parameter
all-gather of ZeRO-1 is the same stream run from the optimizer's end (the optimizer costs nothing on the clock,
so: from the step's start), every bucket ready then; with ``--overlap-param-gather`` the forward of micro-batch 0
on each chunk waits at the first piece that reads a bucket for its end (``forward_gates``, ``gated_ends``; the
waits are the exposed all-gather), without it the gathers run after the DP sync, all exposed.

ZeRO-2 (``zero2_stream``) keeps no whole gradient: a bucket lives only while a backward writes into it
(``tpsim.train.zero2``), so *every* micro-batch's backward reduce-scatters each of its buckets into the owned
slices — DeepSpeed's ZeRO-2, FSDP's SHARD_GRAD_OP, Megatron's distributed optimizer with its overlap. Bucket b
of micro-batch j is ready at the end of the piece that produces its last gradient in j's backward (B, or W when
the backward is split); the m·n reduce-scatters join the one comm stream in issue order — ready time, then
micro-batch, then bucket — by the rule above, and the clock before the optimizer waits for it. A bucket held for
the tied embedding's sum over the embedding group keeps accumulating until then and goes once a step. The live
run issues them during the backward whether or not ``--overlap-grad-reduce`` is given (it refuses the flag with
ZeRO-2: there is nothing left to defer), so the stream is ZeRO-2's rule either way.

When does the overlap hide everything? The Ultra-Scale Playbook (Tazi et al., Hugging Face 2025) states it as
t_compute ≥ t_comm: the backward compute left after a bucket is ready must cover its all-reduce;
``playbook_hides`` is that simple form (the backward compute after the first bucket is ready against the whole
stream), ``comm_stream(...).exposed == 0`` the exact answer under this rule. MPI-free.
"""

from __future__ import annotations

from typing import Collection, NamedTuple, Sequence

from tpsim.pipeline.stage_clock import ROUNDING

HEAD, EMBEDDING = ("head",), ("embedding",)  # piece keys; a layer's is ("layer", i), i its index in the model


def layer(i: int) -> tuple:
    return ("layer", i)


def backward_pieces(layers: Sequence[int], first: bool, last: bool) -> list[tuple]:
    """The pieces of one virtual stage's backward in execution order: head, layers last to first, embedding."""
    return ([HEAD] if last else []) + [layer(i) for i in reversed(list(layers))] + ([EMBEDDING] if first else [])


def forward_pieces(layers: Sequence[int], first: bool, last: bool) -> list[tuple]:
    """The pieces of one virtual stage's forward in execution order: the backward's reversed."""
    return backward_pieces(layers, first, last)[::-1]


def piece_of(path: str, block: str, embeds: Sequence[str], first: bool) -> tuple:
    """The piece a parameter or a traced scope (``path``) belongs to on a virtual stage: ``("layer", i)`` under
    ``{block}.{i}``; the embedding's names (``embeds``) on the first stage — elsewhere a tied embedding's name is
    the LM head's weight, the head's; anything else (final norm, LM head, loss) the head."""
    if path.startswith(block + "."):
        return layer(int(path[len(block) + 1:].split(".", 1)[0]))
    if any(path == e or path.startswith(e + ".") for e in embeds):
        return EMBEDDING if first else HEAD
    return HEAD


def piece_ends(start: float, seconds: Sequence[float]) -> list[float]:
    """Where each piece ends when an action starting at ``start`` runs pieces of ``seconds`` one after another."""
    out, t = [], start
    for s in seconds:
        t = t + s
        out.append(t)
    return out


class BucketSpec(NamedTuple):
    """One DP gradient bucket as the comm stream needs it: its bytes, the virtual stage and piece whose backward
    finishes its last gradient, ``held``: the tied embedding's, ready only after the embedding group's sum, and
    ``first_use``: (virtual stage, piece) of the first forward piece that reads its parameters."""

    nbytes: int
    stage: int
    piece: tuple
    held: bool
    first_use: tuple = ()


class BucketSpan(NamedTuple):
    """One bucket on the comm stream: ready (its last gradient final), start (the stream free too), end;
    ``microbatch``: the micro-batch whose backward made it ready (ZeRO-2), −1 for a collective once a step."""

    bucket: int
    ready: float
    start: float
    end: float
    microbatch: int = -1


class Stream(NamedTuple):
    """The comm stream of one step: its bucket ``spans`` in issue order; ``compute_end``: the compute clock when
    the optimizer would start; ``end``: the clock after the wait for the stream; ``exposed``: that wait;
    ``comm``: Σ the buckets' times; ``hidden``: comm − exposed."""

    spans: tuple[BucketSpan, ...]
    compute_end: float
    end: float
    exposed: float
    comm: float

    @property
    def hidden(self) -> float:
        """comm − exposed; 0 within rounding (the same seconds summed in two orders: ``ROUNDING``)."""
        hidden = self.comm - self.exposed
        return 0.0 if abs(hidden) <= ROUNDING * self.comm else hidden

    @property
    def after_first_ready(self) -> float:
        """The compute left after the first bucket was ready (the Playbook's t_compute; 0 without buckets)."""
        return max(0.0, self.compute_end - min(s.ready for s in self.spans)) if self.spans else 0.0


def comm_stream(order: Sequence[int], ready: Sequence[float], seconds: Sequence[float], compute_end: float) -> Stream:
    """The buckets ``order`` (issue order) with ``ready[b]`` and ``seconds[b]`` (bucket b's α-β time) on one comm
    stream, the compute stream ending at ``compute_end`` (module docstring)."""
    spans, free, comm = [], None, 0.0
    for b in order:
        start = ready[b] if free is None or ready[b] >= free else free
        end = start + seconds[b]
        spans.append(BucketSpan(b, ready[b], start, end))
        free, comm = end, comm + seconds[b]
    end = compute_end if free is None or free <= compute_end else free
    return Stream(tuple(spans), compute_end, end, end - compute_end, comm)


def zero2_stream(ready: Sequence[Sequence[float]], seconds: Sequence[float], compute_end: float,
                 once: Collection[int] = ()) -> Stream:
    """ZeRO-2's reduce-scatters on one rank's comm stream (module docstring): ``ready[j][b]`` when bucket b is
    ready in micro-batch j's backward, ``seconds[b]`` one reduce-scatter of it, the compute stream ending at
    ``compute_end``. A bucket in ``once`` (the tied embedding's, held for its sum) goes once, at ``ready[-1][b]``.
    Issued by ready time, then micro-batch, then bucket; each span says its bucket and micro-batch."""
    last = len(ready) - 1
    issued = sorted((ready[j][b], j, b) for j in range(last + 1) for b in range(len(seconds))
                    if b not in once or j == last)
    stream = comm_stream(range(len(issued)), [t for t, _, _ in issued], [seconds[b] for _, _, b in issued],
                         compute_end)
    spans = tuple(span._replace(bucket=b, microbatch=-1 if b in once else j)
                  for span, (_, j, b) in zip(stream.spans, issued))
    return stream._replace(spans=spans)


def after_compute(n: int, seconds: Sequence[float], compute_end: float) -> Stream:
    """No overlap: the ``n`` buckets one after another from ``compute_end``, every second of them exposed."""
    return comm_stream(range(n), [compute_end] * n, seconds, compute_end)


def forward_order(n: int) -> list[int]:
    """The order the next forward first reads ``n`` buckets packed in backward order: the reverse, the order in
    which ZeRO-1's parameter all-gathers are issued (Megatron-LM's distributed optimizer dispatches them so)."""
    return list(range(n))[::-1]


def forward_gates(buckets: Sequence[BucketSpec], stream: Stream) -> dict[tuple, float]:
    """``--overlap-param-gather``: when each forward piece may start, ``(stage, piece) -> time``: the end of the
    all-gather (``stream``, run from the optimizer's end) of every bucket whose parameters it reads first."""
    gates: dict[tuple, float] = {}
    for span in stream.spans:
        key = buckets[span.bucket].first_use
        gates[key] = max(gates.get(key, span.end), span.end)
    return gates


def gated_ends(start: float, seconds: Sequence[float], gates: Sequence[float]) -> tuple[list[float], float]:
    """Pieces of ``seconds`` from ``start``, piece i starting no earlier than ``gates[i]``: each one's end and the
    time spent waiting for the gates (the exposed parameter all-gather)."""
    out, t, waited = [], start, 0.0
    for s, g in zip(seconds, gates):
        if g > t:
            waited, t = waited + (g - t), g
        t = t + s
        out.append(t)
    return out, waited


def playbook_hides(backward_after_ready: float, comm: float) -> bool:
    """The Ultra-Scale Playbook's condition in its simple form: t_compute ≥ t_comm, the backward compute left
    after the first bucket is ready against the DP communication of the step."""
    return backward_after_ready >= comm
