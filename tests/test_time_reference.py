"""Every clock of tpsim against an independent reference for time (``tests/reference_clock.py``).

The MPI-free clock (``simulate``), its compiled twin (``timed``), the live ranks' clock (``LiveClock``, driven as the
executor drives it: ``time_cases.live_replay``) and the planner's (``pipeline_terms``) are held equal to a small
event-driven simulator that imports none of them:

- hand-worked steps whose spans are written out below — an idle comm stream between two buckets, a bucket ready
  long after the stream went free, a layer whose parameters sit in three buckets, the tied embedding's held
  bucket — through the reference and the live clock; ZeRO-2's per-micro-batch reduce-scatters through the
  reference and the rule the planner prices them with (``tpsim.pipeline.overlap.zero2_stream``);
- random steps drawn with hypothesis: schedules (afab, 1f1b, interleaved, zb-h1), pp ≤ 4, vp ≤ 3, m ≤ 8, random
  piece and message seconds, 1–6 buckets of random sizes cut anywhere (a piece in several, a bucket over several
  pieces and chunks), both overlap flags, ZeRO 0–3, through every clock (ZeRO-2 through the planner's alone:
  the live run does not yet put its per-micro-batch reduce-scatters on its clock), with the reference's
  invariants on every run.

Equal means to 1e-12 relative: the clocks add an action's pieces in another order than the reference.
"""

from __future__ import annotations

import random

from hypothesis import HealthCheck, assume, given, settings, strategies as st

from reference_clock import Bucket, Collective, Span, Step, invariants, simulate as reference
from time_cases import live_replay, planner_step, random_buckets, rank_pieces, replay_costs
from time_invariants import clock_problems, stream_problems, timeline_problems
from tpsim.errors import ConfigError
from tpsim.pipeline.actions import SENDS
from tpsim.pipeline.clock import simulate
from tpsim.pipeline.overlap import zero2_stream
from tpsim.pipeline.schedules import build, compute_orders
from tpsim.pipeline.stage_clock import compiled, timed
from tpsim.plan.dp_overlap import stage_ranges
from tpsim.gpus import gpu
from tpsim.plan.layout import Layout, problems
from tpsim.plan.live import toy_config
from tpsim.plan.of_run import model_spec
from tpsim.plan.pipeline import pipeline_terms

RELATIVE = 1e-12
H, E = ("head",), ("embedding",)


def L(i: int) -> tuple:
    return ("layer", i)


def close(a: float, b: float) -> bool:
    return abs(a - b) <= RELATIVE * max(abs(a), abs(b))


def same_spans(got, want) -> bool:
    return len(got) == len(want) and all(g[:-2] == w[:-2] and close(g[-2], w[-2]) and close(g[-1], w[-1])
                                         for g, w in zip(got, want))


def live_compute(clock) -> list[tuple]:
    """A replayed clock's spans as the reference writes them (a collective's chunk −1)."""
    return [(s.op, s.microbatch, s.chunk if s.microbatch >= 0 else -1, s.start, s.end) for s in clock.spans
            if not s.op.startswith(("DP ", "param "))]


def live_comm(clock) -> list[tuple]:
    """A replayed clock's DP bucket spans as the reference writes them: "DP bucket b [of micro-batch j]"."""
    return [(f"reduce {s.op.split()[2]}", int(s.op.split()[-1]) if "micro-batch" in s.op else -1, -1, s.start, s.end)
            for s in clock.comm_spans()]


# ---------------------------------------------------------------- hand-worked steps, every span written out

ONE_STAGE = {(0, "F"): [(E, 0.0), (L(0), 2.0), (L(1), 2.0), (H, 1.0)],
             (0, "B"): [(H, 1.0), (L(1), 2.0), (L(0), 3.0), (E, 0.0)]}


def one_stage(buckets, **flags) -> Step:
    return Step(1, 1, 1, ((("F", 0, 0), ("B", 0, 0)),), ONE_STAGE, buckets=(tuple(buckets),), **flags)


def test_an_idle_stream_waits_for_the_next_bucket_to_be_ready_and_a_busy_one_queues_it():
    """F [0, 5], B [5, 11]: head [5, 6], layer 1 [6, 8], layer 0 [8, 11]. Bucket 0 (head) reduces in [6, 6.5];
    the stream then idles until bucket 1 (layer 1) is ready at 8, not from 6.5; bucket 2 (layer 0, embedding),
    ready at 11, queues behind it until 12. The compute ends at 11, the stream at 13: 2 s exposed."""
    step = one_stage([Bucket(0.5, ((0, H),)), Bucket(4.0, ((0, L(1)),)), Bucket(1.0, ((0, L(0)), (0, E)))],
                     overlap_grad_reduce=True)
    want_compute = [Span("F", 0, 0, 0.0, 5.0), Span("B", 0, 0, 5.0, 11.0)]
    want_comm = [Span("reduce 0", -1, -1, 6.0, 6.5), Span("reduce 1", -1, -1, 8.0, 12.0),
                 Span("reduce 2", -1, -1, 12.0, 13.0)]
    ref = reference(step)
    assert (ref.compute[0], ref.comm[0], ref.ready[0]) == (want_compute, want_comm, [6.0, 8.0, 11.0])
    assert (ref.end, ref.dp_exposed) == ([13.0], [2.0]) and not invariants(ref, step)
    [clock] = live_replay(step)
    assert live_compute(clock) == want_compute and live_comm(clock) == want_comm
    assert (clock.time, clock.dp.exposed, clock.dp.hidden) == (13.0, 2.0, 3.5)  # 5.5 s of reduces, 2 exposed


def test_a_bucket_ready_long_after_the_stream_went_free_starts_when_it_is_ready():
    """ZeRO-1 with both overlaps. The all-gathers run first, at the step's start, in forward order: bucket 1
    (layer 0, embedding) [0, 1.5], bucket 0 (head, layer 1) [1.5, 2]; the forward waits 1.5 at its embedding and
    runs [0, 6.5]. The stream is then free from 2, but bucket 0 is ready only at 9.5 (layer 1's backward):
    it reduces in [9.5, 10.5], bucket 1 in [12.5, 13.5]."""
    step = one_stage([Bucket(1.0, ((0, H), (0, L(1))), gather=0.5), Bucket(1.0, ((0, L(0)), (0, E)), gather=1.5)],
                     zero=1, overlap_grad_reduce=True, overlap_param_gather=True)
    want_comm = [Span("gather 1", -1, -1, 0.0, 1.5), Span("gather 0", -1, -1, 1.5, 2.0),
                 Span("reduce 0", -1, -1, 9.5, 10.5), Span("reduce 1", -1, -1, 12.5, 13.5)]
    ref = reference(step)
    assert ref.comm[0] == want_comm and ref.compute[0] == [Span("F", 0, 0, 0.0, 6.5), Span("B", 0, 0, 6.5, 12.5)]
    assert ref.pieces[0, "F", 0, E] == (1.5, 1.5) and ref.pieces[0, "F", 0, L(1)] == (3.5, 5.5)
    assert (ref.end, ref.dp_exposed, ref.gather_exposed) == ([13.5], [1.0], [1.5]) and not invariants(ref, step)
    [clock] = live_replay(step)
    assert live_compute(clock) == ref.compute[0] and live_comm(clock) == want_comm[2:]
    assert (clock.time, clock.dp.exposed, clock.gather_exposed) == (13.5, 1.0, 1.5)


def test_a_layer_in_three_buckets_starts_its_forward_after_the_last_of_their_gathers():
    """Layer 1's parameters sit in buckets 0 (with the head), 1 and 2 (with layer 0 and the embedding). Gathered in
    forward order: bucket 2 [0, 0.5], bucket 1 [0.5, 2.5], bucket 0 [2.5, 3.5]. Layer 1's forward starts at 3.5,
    after the last of its three — not at 2.5, when the first that gates it ended. The reduces, not overlapped,
    follow the backward's end at 12.5 one after another; the all-gathers waited for: 0.5 + 1."""
    step = one_stage([Bucket(1.0, ((0, H), (0, L(1))), gather=1.0), Bucket(1.0, ((0, L(1)),), gather=2.0),
                      Bucket(1.0, ((0, L(1)), (0, L(0)), (0, E)), gather=0.5)], zero=1, overlap_param_gather=True)
    ref = reference(step)
    assert [ref.pieces[0, "F", 0, k] for k in (E, L(0), L(1), H)] == [(0.5, 0.5), (0.5, 2.5), (3.5, 5.5), (5.5, 6.5)]
    assert ref.comm[0] == [Span("gather 2", -1, -1, 0.0, 0.5), Span("gather 1", -1, -1, 0.5, 2.5),
                           Span("gather 0", -1, -1, 2.5, 3.5), Span("reduce 0", -1, -1, 12.5, 13.5),
                           Span("reduce 1", -1, -1, 13.5, 14.5), Span("reduce 2", -1, -1, 14.5, 15.5)]
    assert (ref.end, ref.dp_exposed, ref.gather_exposed) == ([15.5], [3.0], [1.5]) and not invariants(ref, step)
    [clock] = live_replay(step)
    assert live_compute(clock) == [Span("F", 0, 0, 0.0, 6.5), Span("B", 0, 0, 6.5, 12.5)]
    assert (clock.time, clock.gather_exposed) == (15.5, 1.5)


def test_the_tied_embeddings_bucket_is_held_until_its_sum_over_the_embedding_group():
    """PP 2, one micro-batch, messages 0.25 s. Rank 0: F [0, 2], waits for the gradient until 8.5, B [8.5, 10.5];
    rank 1: F [2.25, 5.25], B [5.25, 8.25]. The loss broadcast ends both at 10.5 + 0.5, the embedding's all-reduce
    at 12. The tied buckets (rank 0's embedding, rank 1's head) are ready at 12, though their pieces ended at 10.5
    and 6.25; the others reduce as soon as their layer is done."""
    pieces = {(0, "F"): [(E, 0.0), (L(0), 2.0)], (0, "B"): [(L(0), 2.0), (E, 0.0)],
              (1, "F"): [(L(1), 2.0), (H, 1.0)], (1, "B"): [(H, 1.0), (L(1), 2.0)]}
    step = Step(2, 1, 1, ((("F", 0, 0), ("B", 0, 0)),) * 2, pieces, {(0, "F"): 0.25, (1, "B"): 0.25},
                after=(Collective("loss broadcast", {0: 0.5, 1: 0.5}),
                       Collective("embedding all-reduce", {0: 1.0, 1: 1.0})),
                buckets=((Bucket(1.0, ((0, L(0)),)), Bucket(2.0, ((0, E),), held=True)),
                         (Bucket(2.0, ((1, H),), held=True), Bucket(1.0, ((1, L(1)),)))),
                overlap_grad_reduce=True)
    ref = reference(step)
    assert ref.compute == [
        [Span("F", 0, 0, 0.0, 2.0), Span("RECV_B", 0, 0, 2.0, 8.5), Span("B", 0, 0, 8.5, 10.5),
         Span("loss broadcast", -1, -1, 10.5, 11.0), Span("embedding all-reduce", -1, -1, 11.0, 12.0)],
        [Span("RECV_F", 0, 0, 0.0, 2.25), Span("F", 0, 0, 2.25, 5.25), Span("B", 0, 0, 5.25, 8.25),
         Span("loss broadcast", -1, -1, 8.25, 11.0), Span("embedding all-reduce", -1, -1, 11.0, 12.0)]]
    assert ref.ready == [[10.5, 12.0], [12.0, 8.25]]
    assert ref.comm == [[Span("reduce 0", -1, -1, 10.5, 11.5), Span("reduce 1", -1, -1, 12.0, 14.0)],
                        [Span("reduce 1", -1, -1, 8.25, 9.25), Span("reduce 0", -1, -1, 12.0, 14.0)]]
    assert (ref.end, ref.dp_exposed) == ([14.0, 14.0], [2.0, 2.0]) and not invariants(ref, step)
    clocks = live_replay(step)
    assert [live_compute(c) for c in clocks] == ref.compute and [live_comm(c) for c in clocks] == ref.comm


def test_zero3_gathers_one_piece_ahead_and_scatters_after_each_backward_piece():
    """ZeRO-3 on one stage, gathers 1 s a piece, reduce-scatters 0.5 s. Forward: the embedding's gather [0, 1],
    layer 0's issued as the embedding starts [1, 2], layer 1's as layer 0 starts [2, 3], the head's [4, 5]; the
    pieces run [1, 1], [2, 4], [4, 6], [6, 7]. Backward from 7: the head's gather [7, 8], head [8, 9] while layer
    1's gather runs [8, 9]; the head's scatter [9, 9.5] queues layer 0's gather to [9.5, 10.5] while layer 1 runs
    [9, 11], and so on; the last scatter ends at 15, and the backward with it."""
    step = Step(1, 1, 1, ((("F", 0, 0), ("B", 0, 0)),), ONE_STAGE, zero=3,
                zero3={(0, k): (1.0, 0.5) for k in (E, L(0), L(1), H)})
    ref = reference(step)
    assert [ref.pieces[0, "F", 0, k] for k in (E, L(0), L(1), H)] == [(1.0, 1.0), (2.0, 4.0), (4.0, 6.0), (6.0, 7.0)]
    assert [ref.pieces[0, "B", 0, k] for k in (H, L(1), L(0), E)] == [(8.0, 9.0), (9.0, 11.0), (11.0, 14.0),
                                                                      (14.0, 14.0)]
    assert [(s.kind, s.start, s.end) for s in ref.comm[0][4:]] == [
        ("zero3 gather", 7.0, 8.0), ("zero3 gather", 8.0, 9.0), ("zero3 scatter", 9.0, 9.5),
        ("zero3 gather", 9.5, 10.5), ("zero3 scatter", 11.0, 11.5), ("zero3 gather", 11.5, 12.5),
        ("zero3 scatter", 14.0, 14.5), ("zero3 scatter", 14.5, 15.0)]
    assert ref.compute[0] == [Span("F", 0, 0, 0.0, 7.0), Span("B", 0, 0, 7.0, 15.0)] and not invariants(ref, step)


def test_zero2_reduce_scatters_every_micro_batchs_buckets_as_its_backward_finishes_them():
    """ZeRO-2, one stage, two micro-batches, no overlap flag (ZeRO-2 issues them in the backward either way).
    F0 [0, 5], B0 [5, 11] (head [5, 6], layer 1 [6, 8], layer 0 [8, 11]), F1 [11, 16], B1 [16, 22] (head
    [16, 17], layer 1 [17, 19], layer 0 [19, 22]). Micro-batch 0: bucket 0 (head) ready at 6, [6, 8]; bucket 1
    (layer 1) at 8, [8, 12]; bucket 2 (layer 0, embedding) at 11 queues behind it, [12, 13]; the stream idles
    until micro-batch 1's bucket 0 at 17, [17, 19]; bucket 1 [19, 23]; bucket 2, ready at 22, [23, 24]. The
    compute ends at 22: 2 s of the 14 exposed, 12 hidden. The all-gathers follow, [24, 25.5]."""
    orders = ((("F", 0, 0), ("B", 0, 0), ("F", 1, 0), ("B", 1, 0)),)
    buckets = (Bucket(2.0, ((0, H),), gather=0.5), Bucket(4.0, ((0, L(1)),), gather=0.5),
               Bucket(1.0, ((0, L(0)), (0, E)), gather=0.5))
    step = Step(1, 1, 2, orders, ONE_STAGE, buckets=(buckets,), zero=2)
    ref = reference(step)
    assert ref.compute[0] == [Span("F", 0, 0, 0.0, 5.0), Span("B", 0, 0, 5.0, 11.0), Span("F", 1, 0, 11.0, 16.0),
                              Span("B", 1, 0, 16.0, 22.0)]
    want = [Span("reduce 0", 0, -1, 6.0, 8.0), Span("reduce 1", 0, -1, 8.0, 12.0), Span("reduce 2", 0, -1, 12.0, 13.0),
            Span("reduce 0", 1, -1, 17.0, 19.0), Span("reduce 1", 1, -1, 19.0, 23.0),
            Span("reduce 2", 1, -1, 23.0, 24.0), Span("gather 2", -1, -1, 24.0, 24.5),
            Span("gather 1", -1, -1, 24.5, 25.0), Span("gather 0", -1, -1, 25.0, 25.5)]
    assert ref.comm[0] == want and ref.ready[0] == [17.0, 19.0, 22.0]
    assert (ref.end, ref.dp_exposed, ref.gather_exposed) == ([25.5], [2.0], [1.5]) and not invariants(ref, step)
    stream = zero2_stream([[6.0, 8.0, 11.0], [17.0, 19.0, 22.0]], [2.0, 4.0, 1.0], 22.0)  # the planner's rule
    assert [(f"reduce {s.bucket}", s.microbatch, -1, s.start, s.end) for s in stream.spans] == want[:6]
    assert (stream.end, stream.exposed, stream.comm, stream.hidden) == (24.0, 2.0, 14.0, 12.0)


def test_zero2_holds_the_tied_embeddings_bucket_and_reduce_scatters_it_once():
    """The held bucket of ZeRO-2 goes once a step, after the embedding group's sum (here at 23.5, one collective
    of 1.5 s after the schedule), marked micro-batch −1; the others go every micro-batch."""
    orders = ((("F", 0, 0), ("B", 0, 0), ("F", 1, 0), ("B", 1, 0)),)
    buckets = (Bucket(2.0, ((0, H),)), Bucket(1.0, ((0, L(1)), (0, L(0)), (0, E)), held=True))
    step = Step(1, 1, 2, orders, ONE_STAGE, after=(Collective("embedding all-reduce", {0: 1.5}),),
                buckets=(buckets,), zero=2, overlap_param_gather=True)
    ref = reference(step)
    assert ref.comm[0][-3:] == [Span("reduce 0", 0, -1, 6.0, 8.0), Span("reduce 0", 1, -1, 17.0, 19.0),
                                Span("reduce 1", -1, -1, 23.5, 24.5)]
    assert (ref.end, ref.dp_exposed) == ([24.5], [1.0]) and not invariants(ref, step)
    stream = zero2_stream([[6.0, 23.5], [17.0, 23.5]], [2.0, 1.0], 23.5, once={1})
    assert [(f"reduce {s.bucket}", s.microbatch, -1, s.start, s.end) for s in stream.spans] == ref.comm[0][-3:]


# ---------------------------------------------------------------- random steps, every clock

FAST = settings(max_examples=80, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def schedules(draw):
    name = draw(st.sampled_from(["afab", "1f1b", "interleaved", "zb-h1"]))
    pp = draw(st.integers(2 if name == "interleaved" else 1, 4))
    vp = draw(st.integers(2, 3)) if name == "interleaved" else 1
    m = draw(st.integers(1, 8))
    try:
        orders = compute_orders(name, pp, m, vp)
    except ConfigError:
        assume(False)
    return name, pp, vp, m, tuple(map(tuple, orders))


def random_pieces(rng: random.Random, pp: int, vp: int, split: bool) -> dict:
    """1–2 layers a virtual stage, the embedding on the first, the head on the last; each piece's F, B and W
    seconds at random (the embedding's sometimes 0, as a GPU clock prices it)."""
    stages, out, at = pp * vp, {}, 0
    for s in range(stages):
        keys = [E] * (s == 0) + [L(i) for i in range(at, at + rng.randint(1, 2))] + [H] * (s == stages - 1)
        at += sum(k[0] == "layer" for k in keys)
        for op in ("F", "B", "W") if split else ("F", "B"):
            cost = [0.0 if k == E and rng.random() < 0.5 else rng.uniform(0.05, 2.0) for k in keys]
            order = list(zip(keys, cost))
            out[s, op] = order if op == "F" else order[::-1]
    return out


@FAST
@given(schedules(), st.integers(0, 2 ** 32 - 1))
def test_random_schedules_every_clock_gives_the_references_spans(schedule, seed):
    """No buckets: simulate's, timed's and the live clock's spans (actions and receives) are the reference's."""
    name, pp, vp, m, orders = schedule
    rng = random.Random(seed)
    split = name == "zb-h1"
    pieces = random_pieces(rng, pp, vp, split)
    message = {(s, d): rng.choice([0.0, rng.uniform(0.0, 1.0)]) for s in range(pp * vp) for d in "FB"}
    step = Step(pp, vp, m, orders, pieces, message)
    ref = reference(step)
    assert not invariants(ref, step)
    sch, costs = build(name, pp, m, vp), replay_costs(step)
    t = simulate(sch, costs)
    spans = [[(a.op, a.microbatch, a.chunk, *span) for a, span in zip(acts, sp) if a.op not in SENDS]
             for acts, sp in zip(sch.ranks, t.spans)]
    assert all(same_spans(got, want) for got, want in zip(spans, ref.compute)), (spans, ref.compute)
    assert not timeline_problems(t)
    assert close(t.step, ref.step)  # busy + idle = the step on every rank, idle ≥ 0:
    assert all(abs(i + b - ref.step) <= RELATIVE * ref.step and i >= 0 for i, b in zip(t.idle, t.busy))
    c = compiled(name, pp, m, vp)
    table = [[[costs.compute[op](r, ch, 0) for op in "FBW"] for ch in range(vp)] for r in range(pp)]
    fast = timed(c, table, [[message[s, d] for d in "FB"] for s in range(pp * vp)])
    assert close(fast.step, ref.step) and all(close(a, b) for a, b in zip(fast.finish, ref.schedule_end))
    assert all(abs(i + b - fast.step) <= RELATIVE * fast.step and i >= 0 for i, b in zip(fast.idle, fast.busy))
    clocks = live_replay(step)
    assert all(same_spans(live_compute(k), want) for k, want in zip(clocks, ref.compute))
    assert not [p for k in clocks for p in clock_problems(k)]


@FAST
@given(schedules(), st.integers(0, 2 ** 32 - 1), st.integers(0, 2), st.booleans(), st.booleans(), st.booleans())
def test_random_buckets_the_live_clock_gives_the_references_spans(schedule, seed, zero, grad, gather, tied):
    """1–6 buckets a rank cut anywhere, ZeRO 0–2 (ZeRO-2: every micro-batch's reduce-scatters), each overlap on or
    off, the tied embedding's bucket held: every compute span, receive, collective after the schedule and DP
    bucket of the live clock is the reference's."""
    name, pp, vp, m, orders = schedule
    rng = random.Random(seed)
    pieces = random_pieces(rng, pp, vp, name == "zb-h1")
    stages = pp * vp
    ranges = [  # each stage's layers, read back from its pieces
        [k[1] for k, _ in pieces[s, "F"] if k[0] == "layer"] for s in range(stages)]
    held = {(0, E), (stages - 1, H)} if tied and pp > 1 else set()
    buckets = []
    for r in range(pp):
        cut = random_buckets(rng, rank_pieces(ranges, pp, vp, r), rng.randint(1, 6), held)
        buckets.append(tuple(Bucket(rng.uniform(0.01, 3.0), where, rng.uniform(0.01, 2.0), spec.held)
                             for spec, where in cut))
    after = [Collective("loss broadcast", {r: 0.125 for r in range(pp)})] if pp > 1 else []
    if held:
        after.append(Collective("embedding all-reduce", {0: 0.5, pp - 1: 0.5}))
    message = {(s, d): rng.uniform(0.0, 0.5) for s in range(stages) for d in "FB"}
    start = tuple([0.0] * (pp - 1) + [rng.choice([0.0, 0.25])])
    step = Step(pp, vp, m, orders, pieces, message, start, tuple(after), tuple(buckets), zero,
                overlap_grad_reduce=grad, overlap_param_gather=gather and zero > 0)
    ref = reference(step)
    assert not invariants(ref, step)
    clocks = live_replay(step)
    for r, clock in enumerate(clocks):
        assert not clock_problems(clock)
        got = [s for s in live_compute(clock) if s[0] != "loss normalizer"]
        assert same_spans(got, ref.compute[r]), (r, got, ref.compute[r])
        assert same_spans(live_comm(clock), [s for s in ref.comm[r] if s.kind.startswith("reduce")])
        assert close(clock.time, ref.end[r]) and close(clock.gather_exposed, ref.gather_exposed[r])
        assert close(clock.dp.exposed, ref.dp_exposed[r])


@FAST
@given(schedules(), st.integers(0, 2 ** 32 - 1))
def test_random_zero3_actions_the_live_clock_gives_the_references_spans(schedule, seed):
    """ZeRO-3 with every piece's all-gather and reduce-scatter seconds at random (0 sometimes): the live clock's
    compute spans and its comm stream (``LiveClock.sharded_action``, ``tpsim.pipeline.prefetch``) are the
    reference's, every gather one piece ahead, every reduce-scatter behind its piece."""
    name, pp, vp, m, orders = schedule
    rng = random.Random(seed)
    pieces = random_pieces(rng, pp, vp, name == "zb-h1")
    zero3 = {(s, k): (rng.choice([0.0, rng.uniform(0.01, 3.0)]), rng.choice([0.0, rng.uniform(0.01, 3.0)]))
             for (s, op), work in pieces.items() if op == "F" for k, _ in work}
    message = {(s, d): rng.uniform(0.0, 0.5) for s in range(pp * vp) for d in "FB"}
    step = Step(pp, vp, m, orders, pieces, message, zero=3, zero3=zero3)
    ref = reference(step)
    assert not invariants(ref, step)
    for r, clock in enumerate(live_replay(step)):
        assert not clock_problems(clock)
        assert same_spans(live_compute(clock), ref.compute[r]), (r, live_compute(clock), ref.compute[r])
        want = [(s.kind.split()[1], s.start, s.end) for s in ref.comm[r] if s.end > s.start]
        got = [("gather" if s.op.startswith("all-gather") else "scatter", s.start, s.end) for s in clock.comm_spans()]
        assert len(got) == len(want) and all(g[0] == w[0] and close(g[1], w[1]) and close(g[2], w[2])
                                             for g, w in zip(got, want)), (r, got, want)
        stream_end = max([s.end for s in clock.comm_spans()], default=0.0)
        assert clock.time >= stream_end - RELATIVE * clock.time  # no action ends before its stream


GPU = gpu("h100-80gb")


@settings(max_examples=150, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(["afab", "1f1b", "interleaved", "zb-h1"]), st.integers(1, 4), st.integers(2, 3),
       st.integers(1, 8), st.sampled_from([1, 2]), st.sampled_from([1, 2, 4]), st.integers(0, 3), st.booleans(),
       st.booleans(), st.sampled_from(["gpt2", "llama"]), st.integers(1, 2), st.integers(0, 2 ** 32 - 1))
def test_random_layouts_the_planners_clock_gives_the_references_step(name, pp, vp, m, tp, dp, zero, grad, gather,
                                                                    arch, per, seed):
    """Toy GPT-2 and Llama layouts on an H100, each rank's DP buckets cut at random: the planner's schedule end per
    rank, DP bucket spans, exposed all-gather and step are the reference's, given the planner's own piece, message,
    collective and bucket seconds (``time_cases.planner_step``)."""
    vp = vp if name == "interleaved" else 1
    model = model_spec(model_spec(toy_config(arch)).config(layers=pp * vp * per))
    lay = Layout(tp=tp, dp=dp, pp=pp, zero=zero, seq_len=16, micro_batch=2, global_batch=2 * dp * m, schedule=name,
                 vp=vp, overlap_grad_reduce=grad, overlap_param_gather=gather and zero in (1, 2))
    assume(not problems(model, lay))
    rng = random.Random(seed)
    held = {(0, E), (pp * vp - 1, H)} if model.tied and pp > 1 else set()
    ranges = stage_ranges(model, lay)
    buckets = [random_buckets(rng, rank_pieces(ranges, pp, vp, r), rng.randint(1, 6), held) for r in range(pp)] \
        if dp > 1 and zero < 3 else None
    step = planner_step(model, lay, GPU, buckets)
    ref = reference(step)
    assert not invariants(ref, step)
    out = pipeline_terms(model, lay, GPU, None if buckets is None else [[b for b, _ in rank] for rank in buckets])
    tail = out["after_schedule"]
    assert close(out["makespan_s"], ref.makespan) and close(out["step_s"], ref.step)
    for r in range(pp):
        assert close(out["ranks"][r]["finish_s"], ref.schedule_end[r]) and close(tail["ends"][r], ref.end[r])
        if buckets is not None:
            stream = tail["dp_streams"][r]
            assert not stream_problems(stream, f"rank {r}")
            got = [(f"reduce {b['bucket']}", b["microbatch"], -1, b["start"], b["end"]) for b in stream["buckets"]]
            assert same_spans(got, [s for s in ref.comm[r] if s.kind.startswith("reduce")])
            assert abs(stream["exposed_s"] - ref.dp_exposed[r]) <= RELATIVE * ref.step
        if buckets is not None and zero in (1, 2):
            assert abs(tail["param_gather"][r]["exposed_s"] - ref.gather_exposed[r]) <= RELATIVE * ref.step
