"""The reference for time: a small event-driven simulator of one training step, written from the rules' statement.

tpsim prices time in several places — the MPI-free clock (``tpsim.pipeline.clock.simulate``), its compiled twin
(``tpsim.pipeline.stage_clock.timed``), the live ranks' clock (``tpsim.live_pipeline.clock.LiveClock``) and the
planner's (``tpsim.plan.pipeline.pipeline_terms``). Tests hold them equal to each other; this file is what they are held
equal *to*. It imports nothing from tpsim, so a rule that is wrong in the code they share is not wrong here.
Its inputs are what a step is made of (a schedule, durations, buckets); its output is every span.

The model (all the rules the clocks state, and nothing of how they compute them):

    streams      each pipeline rank has a compute stream and one comm stream. A stream runs one thing at a time,
                 in the order things are issued to it; a comm op starts at max(issued, stream free).
    actions      each rank runs its compute order ``[(op, micro-batch, chunk)]`` (op F, B or W) in order; chunk c
                 of rank r is virtual stage c·pp + r. An action is a list of pieces in execution order, each with
                 its seconds; it lasts their sum (plus any waits below).
    messages     F of j on stage s > 0 starts no earlier than the end of F of j on stage s − 1 plus that
                 message's seconds; B of j on stage s < last no earlier than the end of B of j on stage s + 1 plus
                 its message. The wait is a receive span (RECV_F, RECV_B): from the rank's clock to the arrival.
    ZeRO-1/2     with overlap_param_gather: every bucket's all-gather is issued at the step's start (t = 0) on the
                 comm stream, in forward order (the last bucket first); a piece of micro-batch 0's forward waits for
                 the all-gather of *every* bucket holding one of its parameters. Without it: the all-gathers run
                 after the DP sync, one after another.
    ZeRO-3       in an action, piece i's parameters are all-gathered before it computes (F, and B) — the gather of
                 piece 0 issued at the action's start, of piece i + 1 when piece i starts (one piece ahead) — and
                 its gradients reduce-scattered when its backward ends (B unsplit, or W when split); the action
                 ends when its compute and its comm stream are both done.
    after        when a rank's schedule is done, the collectives around it run in order: each ends on every rank
                 of its group at the group's latest clock plus its seconds on that rank.
    DP buckets   a bucket is *ready* when its last gradient is final: the latest end, in each stage's last
                 gradient-producing action (the last B, or W when the backward is split), of the pieces holding
                 its parameters; the tied embedding's (``held``) no earlier than the collectives after the
                 schedule. overlap_grad_reduce: each is issued when ready (ties: bucket order); without: all at
                 the end of those collectives, in bucket order. The rank's clock then waits for the stream.
    ZeRO-2       no rank keeps a whole gradient, so a bucket is reduce-scattered in *every* micro-batch: in
                 micro-batch j it is ready at the latest end, in j's gradient-producing action of each stage, of
                 the pieces holding its parameters, and issued then, overlap flag or not (a held bucket
                 accumulates until the collectives after the schedule and goes once, as above). Everything ready
                 at the same moment is issued micro-batch first, then bucket order. ``seconds``: one
                 reduce-scatter. The rank's clock waits for the stream as above.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, NamedTuple, Sequence

Piece = tuple  # a piece's key: ("head",), ("layer", i), ("embedding",); the caller's names, compared only


class Span(NamedTuple):
    """One span: ``kind`` F, B, W, RECV_F, RECV_B, a collective's name, or on the comm stream "reduce b",
    "gather b", "zero3 gather"/"zero3 scatter"; (micro-batch, chunk) or −1; start and end."""

    kind: str
    microbatch: int
    chunk: int
    start: float
    end: float


@dataclass(frozen=True)
class Bucket:
    """One DP gradient bucket: its reduce seconds, its parameter all-gather's seconds (ZeRO-1/2), the pieces
    ``(virtual stage, piece)`` holding its parameters, and whether it is the tied embedding's."""

    seconds: float
    holds: tuple[tuple[int, Piece], ...]
    gather: float = 0.0
    held: bool = False


@dataclass(frozen=True)
class Collective:
    """A collective after the schedule: its name, the pipeline ranks of its group, each one's seconds."""

    name: str
    seconds: Mapping[int, float]


@dataclass(frozen=True)
class Step:
    """Everything the reference needs. ``pieces[stage, op]``: that stage's action as ``(piece, seconds)`` in
    execution order; ``message[sender stage, "F" | "B"]``; ``zero3[stage, piece]``: (gather, reduce-scatter)
    seconds; ``buckets[rank]`` in bucket order."""

    pp: int
    vp: int
    microbatches: int
    orders: tuple[tuple[tuple[str, int, int], ...], ...]
    pieces: Mapping[tuple[int, str], Sequence[tuple[Piece, float]]]
    message: Mapping[tuple[int, str], float] = field(default_factory=dict)
    start: tuple[float, ...] = ()
    after: tuple[Collective, ...] = ()
    buckets: tuple[tuple[Bucket, ...], ...] = ()
    zero: int = 0
    zero3: Mapping[tuple[int, Piece], tuple[float, float]] = field(default_factory=dict)
    overlap_grad_reduce: bool = False
    overlap_param_gather: bool = False


@dataclass
class Result:
    """Every span, per rank: ``compute`` (actions, receives, collectives after the schedule, in order), ``comm``
    (the comm stream; a reduce's micro-batch is ZeRO-2's, −1 once a step), ``pieces[(stage, op, micro-batch,
    piece)] = (start, end)``; each rank's ``schedule_end``, ``before_dp`` (after the collectives), ``ready`` (when
    its buckets' last gradients are final), ``issued`` (``(micro-batch, bucket) -> when that reduce was issued``),
    ``end``; ``dp_exposed``, ``gather_exposed``."""

    compute: list[list[Span]]
    comm: list[list[Span]]
    pieces: dict
    schedule_end: list[float]
    before_dp: list[float]
    ready: list[list[float]]
    end: list[float]
    dp_exposed: list[float]
    gather_exposed: list[float]
    issued: list[dict] = field(default_factory=list)

    @property
    def step(self) -> float:
        return max(self.end)

    @property
    def makespan(self) -> float:
        return max(self.schedule_end)


class Stream:
    """One comm stream: FIFO in issue order."""

    def __init__(self, spans: list[Span]) -> None:
        self.free, self.spans = 0.0, spans

    def issue(self, kind: str, at: float, seconds: float, microbatch: int = -1, chunk: int = -1) -> float:
        start = max(at, self.free)
        self.free = start + seconds
        self.spans.append(Span(kind, microbatch, chunk, start, self.free))
        return self.free


def simulate(step: Step) -> Result:
    """Run ``step`` (module docstring); raises ``RuntimeError`` if the orders cannot all run (a deadlock)."""
    pp, stages = step.pp, step.pp * step.vp
    split = any(op == "W" for order in step.orders for op, _, _ in order)
    clock = list(step.start) if step.start else [0.0] * pp
    compute: list[list[Span]] = [[] for _ in range(pp)]
    comm: list[list[Span]] = [[] for _ in range(pp)]
    streams = [Stream(comm[r]) for r in range(pp)]
    ends: dict[tuple[str, int, int], float] = {}  # (op, micro-batch, stage) -> end
    pieces: dict = {}
    buckets = step.buckets or tuple(() for _ in range(pp))
    gates = [_gates(step, r, streams[r]) for r in range(pp)]  # (stage, piece) -> all-gathers' end
    waited = [0.0] * pp
    at, left = [0] * pp, sum(len(o) for o in step.orders)
    while left:
        moved = False
        for r, order in enumerate(step.orders):
            while at[r] < len(order):
                op, j, c = order[at[r]]
                s = c * pp + r
                dep = ("F", j, s - 1) if op == "F" and s > 0 else ("B", j, s + 1) if op == "B" and s < stages - 1 \
                    else None
                if dep is not None and dep not in ends:
                    break
                t = clock[r]
                if dep is not None:
                    arrival = ends[dep] + step.message.get((dep[2], dep[0]), 0.0)
                    compute[r].append(Span(f"RECV_{op}", j, c, t, max(t, arrival)))
                    t = max(t, arrival)
                gate = gates[r] if op == "F" and j == 0 else {}
                end, wait = _action(step, streams[r], pieces, s, op, j, t, gate, split)
                waited[r] += wait
                compute[r].append(Span(op, j, c, t, end))
                ends[op, j, s] = clock[r] = end
                at[r] += 1
                left -= 1
                moved = True
        if not moved:
            raise RuntimeError(f"the orders cannot run: each rank stops at {at}")
    schedule_end = list(clock)
    for coll in step.after:
        latest = max(clock[r] for r in coll.seconds)
        for r, seconds in coll.seconds.items():
            compute[r].append(Span(coll.name, -1, -1, clock[r], latest + seconds))
            clock[r] = latest + seconds
    before_dp = list(clock)
    ready, issued, end, dp_exposed = [], [], [], []
    last = step.microbatches - 1
    for r in range(pp):
        mine = [_ready(step, pieces, b, before_dp[r], split, last) for b in buckets[r]]
        ready.append(mine)
        if step.zero == 2:  # every micro-batch's reduce-scatters, as its backward finishes each bucket
            queue = sorted((_ready(step, pieces, bucket, before_dp[r], split, j), j, b)
                           for j in range(step.microbatches) for b, bucket in enumerate(buckets[r])
                           if not bucket.held or j == last)
            queue = [(t, -1 if buckets[r][b].held else j, b) for t, j, b in queue]  # a held one: once a step
        else:
            queue = sorted((t if step.overlap_grad_reduce else before_dp[r], -1, b) for b, t in enumerate(mine))
        at = {(j, b): t for t, j, b in queue}
        for t, j, b in queue:
            streams[r].issue(f"reduce {b}", t, buckets[r][b].seconds, microbatch=j)
        issued.append(at)
        done = max([before_dp[r]] + [s.end for s in comm[r] if s.kind.startswith("reduce")])
        dp_exposed.append(done - before_dp[r])
        if step.zero in (1, 2) and not step.overlap_param_gather:  # the all-gathers after the sync, all exposed
            for b in reversed(range(len(buckets[r]))):
                done = streams[r].issue(f"gather {b}", done, buckets[r][b].gather)
            waited[r] = done - before_dp[r] - dp_exposed[r]
        end.append(done)
    return Result(compute, comm, pieces, schedule_end, before_dp, ready, end, dp_exposed, waited, issued)


def _gates(step: Step, r: int, stream: Stream) -> dict:
    """ZeRO-1/2 with overlap_param_gather: every bucket's all-gather issued at 0 in forward order; each piece it
    holds may start its first forward only once it has ended (the latest of its buckets')."""
    if step.zero not in (1, 2) or not step.overlap_param_gather or not step.buckets:
        return {}
    gate: dict = {}
    for b in reversed(range(len(step.buckets[r]))):
        bucket = step.buckets[r][b]
        done = stream.issue(f"gather {b}", 0.0, bucket.gather)
        for where in bucket.holds:
            gate[where] = max(gate.get(where, 0.0), done)
    return gate


def _action(step: Step, stream: Stream, pieces: dict, s: int, op: str, j: int, t: float, gate: dict,
            split: bool) -> tuple[float, float]:
    """One action of stage ``s`` from ``t``: its pieces one after another (each after its gate, and under ZeRO-3
    after its own all-gather); returns its end and the time it waited at gates."""
    work = list(step.pieces[s, op])
    gathers = step.zero == 3 and op in ("F", "B")
    scatters = step.zero == 3 and op == ("W" if split else "B")
    arrived = stream.issue("zero3 gather", t, step.zero3[s, work[0][0]][0], j, s) if gathers and work else t
    waited = 0.0
    for i, (key, seconds) in enumerate(work):
        start = max(t, gate.get((s, key), 0.0), arrived)
        waited += max(0.0, gate.get((s, key), 0.0) - max(t, arrived))
        if gathers and i + 1 < len(work):
            arrived = stream.issue("zero3 gather", start, step.zero3[s, work[i + 1][0]][0], j, s)
        t = start + seconds
        pieces[s, op, j, key] = (start, t)
        if scatters:
            stream.issue("zero3 scatter", t, step.zero3[s, key][1], j, s)
    if step.zero == 3:
        t = max(t, stream.free)
    return t, waited


def _ready(step: Step, pieces: dict, bucket: Bucket, before_dp: float, split: bool, j: int) -> float:
    """When a bucket's gradient is final in micro-batch ``j``'s backward (module docstring)."""
    op = "W" if split else "B"
    t = max(pieces[stage, op, j, key][1] for stage, key in bucket.holds)
    return max(t, before_dp) if bucket.held else t


def invariants(result: Result, step: Step) -> list[str]:
    """What must hold of any step's spans, each broken rule as one line (empty: all hold): spans on one stream
    never overlap and never run backwards; no bucket's reduce starts before it is ready; no piece of a first
    forward starts before every all-gather of its parameters has ended; busy + idle = the step on every rank."""
    out = []
    for r in range(step.pp):
        for name, spans in (("compute", [s for s in result.compute[r] if not s.kind.startswith("RECV")]),
                            ("comm", result.comm[r])):
            out += [f"rank {r} {name}: {a} overlaps {b}" for a, b in zip(spans, spans[1:]) if b.start < a.end]
            out += [f"rank {r} {name}: {a} ends before it starts" for a in spans if a.end < a.start]
        for (j, b), t in result.issued[r].items():
            out += [f"rank {r}: {s} starts before bucket {b} of micro-batch {j} is ready at {t}"
                    for s in result.comm[r] if s.kind == f"reduce {b}" and s.microbatch == j and s.start < t]
        busy = sum(s.end - s.start for s in result.compute[r] if s.kind in ("F", "B", "W"))
        if busy > result.step * (1 + 1e-12):
            out.append(f"rank {r}: busy {busy} exceeds the step {result.step}")
    gathers = {(r, int(s.kind.split()[1])): s.end for r in range(step.pp) for s in result.comm[r]
               if s.kind.startswith("gather ")}
    if step.overlap_param_gather:
        for r, buckets in enumerate(step.buckets):
            for b, bucket in enumerate(buckets):
                for stage, key in bucket.holds:
                    begun = result.pieces[stage, "F", 0, key][0]
                    if begun < gathers[r, b]:
                        out.append(f"rank {r}: forward piece {key} of stage {stage} starts at {begun}, before "
                                   f"bucket {b}'s all-gather ends at {gathers[r, b]}")
    return out
