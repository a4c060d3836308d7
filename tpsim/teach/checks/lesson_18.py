"""The check of exercise 18: stage i's ZB-H1 order with its W's placed, and a schedule's bubble and peak in
flight predicted for (p, m, v), against ``tpsim.pipeline``, then against an interleaved pipeline on live ranks.

1. ``zb_h1_order(p, m, i)`` for every stage of many pipelines (one stage, fewer micro-batches than stages, more)
   against the compute actions of ``build("zb-h1", ...)``, compared as rows (op: F 0, B 1, W 2; micro-batch).
2. ``bubble_fraction(schedule, p, m, v)`` and ``peak_in_flight(schedule, p, m, v)`` for 1F1B, interleaved and
   ZB-H1 against the virtual clock (``simulate(build(...))``: its bubble, ``in_flight`` of the lists).
3. If every answer was right on every rank: interleaved 1F1B with v = 2, m = 8 runs on a pipeline of a tiny GPT,
   one stage per MPI rank (``tpsim.live_pipeline.executor``), and the two predictions are compared with the live clocks'
   bubble and the peaks of caches the executors held.

The functions are arithmetic: every process makes every call (a call is collective) and the process
``k % world`` compares the k-th answer, so each finding is reported once. Each typical slip is written out below
as what it returns, so the check names it by what the learner's result looks like (``tpsim.teach.diagnose``),
never by the answer.
"""

from __future__ import annotations

import numpy as np

from tpsim.arch import GPTConfig, architecture_of
from tpsim.comm import ProcessGrid
from tpsim.pipeline.actions import COMPUTE
from tpsim.pipeline.clock import simulate
from tpsim.pipeline.schedules import build
from tpsim.live_pipeline.build import pipeline_from_serial
from tpsim.live_pipeline.clock import bubble_measured
from tpsim.live_pipeline.executor import Executor
from tpsim.live_pipeline.split import split_layers
from tpsim.live_pipeline.step import pipeline_grads
from tpsim.teach.checks.registry import exercise
from tpsim.teach.returned import describe
from tpsim.teach.verdict import BROKE, FOUND, OK, WRONG, Report, Stop

OPS = {"F": 0, "B": 1, "W": 2}
Order = list[tuple[str, int]]

# --- slips of zb_h1_order -----------------------------------------------------------------------------------
FUSED = ("every W of yours runs right after its own B: that is the backward cut in two with nothing moved, so the "
         "drain is as idle as it was; ZB-H1 delays stage i's W's to fill it")
W_LATE = ("your W's start one micro-batch late: stage i's first W comes one B later than ZB-H1's, so the stage "
          "holds its micro-batches longer than it needs to")
W_EARLY = ("your W's start one micro-batch early on the stages after the first: an early W takes a slot that the "
           "stage's F's and B's need, and its neighbours wait for those, never for a W")
DELAY_REVERSED = ("your W delay grows the wrong way: it is the first stage that runs its W's without delay, "
                  "and each later stage waits one micro-batch more")
W_AT_END = ("all your W's wait until every B has run: a legal order, but then the stage holds every micro-batch "
            "until the end; ZB-H1 puts the W's into the slots where 1F1B idles")
W_BEFORE_B = ("a W of yours runs before the B of its own micro-batch: the weight gradient needs the gradient "
              "of the stage's output, which arrives for B, so a W always follows its own B")
NO_W = ("your order has no W: ZB-H1 cuts every backward into B (the input gradient) and W (the weight gradient), "
        "m of each on every stage")
EXTRA_WARMUP = ("your stage runs one forward too many before its first B: ZB-H1 keeps 1F1B's warm-up exactly")
UNCAPPED = ("your warm-up is not capped by m: with fewer micro-batches than the warm-up would take, the stage "
            "runs forwards of micro-batches that do not exist")
DRAIN_REVERSED = ("the W's left at the end run in reverse micro-batch order: a stage's W's go in the order of "
                  "its B's")

# --- slips of bubble_fraction --------------------------------------------------------------------------------
V_FORGOTTEN = ("your interleaved bubble is 1F1B's at the same m: with v chunks a rank runs v·m forwards of 1/v "
               "the cost, so the fill and drain are v times shorter against the same work")
V_OUTSIDE = ("you divided the whole of 1F1B's bubble fraction by v: interleaving shortens the fill and drain v "
             "times, not the m·(t_f + t_b) of work, so the step does not shrink v times")
IDLE_OVER_BUSY = ("yours is the idle time over the busy time (Narayanan et al. write (p − 1)/m that way): "
                  "tpsim's bubble is the idle share of the whole step, idle over busy plus idle")
P_NOT_P_MINUS_1 = ("you counted p stages of filling and draining: micro-batch 0 starts on stage 0 at once, so it "
                   "is p − 1 of them")
ZB_AS_1F1B = ("your ZB-H1 bubble is 1F1B's: split into B and W, the gradient runs back in t_B a stage and the "
              "W's fill the drain, so the idle time shrinks")
ZB_SMALL_M = ("with fewer micro-batches than stages your ZB-H1 bubble still assumes the W's fill the whole "
              "drain: a stage has only m W's, too few when m < p")
ZB_THIRD = ("yours is a third of 1F1B's bubble fraction: the idle time falls to a third, but the step gets "
            "shorter too, so the share of it does not")

# --- slips of peak_in_flight ---------------------------------------------------------------------------------
WARMUP_ONLY = ("you counted the warm-up forwards only: the stage runs one forward more before its first "
               "backward frees anything")
PEAK_UNCAPPED = ("your peak is not capped: a stage cannot hold more micro-batches (with chunks, (micro-batch, "
                 "chunk) pairs) than the step has")
STAGE0_PEAK = ("every stage of your 1F1B holds what stage 0 holds: a later stage has a shorter warm-up, so it "
               "holds fewer")
ZB_PEAK_AS_1F1B = ("your ZB-H1 peaks are 1F1B's: a micro-batch is held until its W, and stage i's W's lag its "
                   "B's, so a later stage holds more than under 1F1B")
INTERLEAVED_AS_1F1B = ("your interleaved peaks are 1F1B's: with v chunks the warm-up is Megatron-LM's longer "
                       "one, and every (micro-batch, chunk) pair is held from its F to its B")
INTERLEAVED_AT_V1 = ("at v = 1 you used the interleaved warm-up: with one chunk a rank the schedule is plain "
                     "1F1B, warm-up p − i − 1")

ORDER_CASES = [(4, 8), (4, 2), (1, 1), (1, 4), (2, 1), (2, 5), (3, 7), (4, 4), (5, 5), (5, 12), (6, 3), (8, 16)]
# (schedule, p, m, v): rank 0 compares cases 0, 4, 8, ... on 4 ranks — a 1F1B, an interleaved, a ZB-H1 with
# m ≥ p, one with m < p, an interleaved capped by v·m and one at v = 1, so each slip shows first there
PREDICT_CASES = [("1f1b", 4, 8, 1), ("1f1b", 4, 2, 1), ("1f1b", 1, 3, 1), ("1f1b", 6, 4, 1),
                 ("interleaved", 4, 8, 2), ("interleaved", 2, 6, 3), ("interleaved", 3, 3, 2),
                 ("interleaved", 5, 10, 2),
                 ("zb-h1", 4, 8, 1), ("zb-h1", 3, 3, 1), ("zb-h1", 8, 3, 1), ("zb-h1", 1, 4, 1),
                 ("zb-h1", 4, 2, 1), ("zb-h1", 5, 7, 1), ("1f1b", 2, 1, 1), ("zb-h1", 2, 9, 1),
                 ("interleaved", 4, 4, 4), ("interleaved", 4, 12, 2), ("interleaved", 8, 8, 2),
                 ("interleaved", 2, 4, 2), ("interleaved", 4, 6, 1), ("interleaved", 3, 5, 1)]
LIVE_M, LIVE_V = 8, 2


def reference_order(p: int, m: int, i: int) -> Order:
    """Stage i's compute actions of tpsim's ZB-H1 schedule."""
    return [(a.op, a.microbatch) for a in build("zb-h1", p, m).ranks[i] if a.op in COMPUTE]


def as_rows(order) -> np.ndarray | None:
    """``[n, 2]`` rows (F 0, B 1, W 2; the micro-batch), or None unless ``order`` is a list of (op, j) pairs."""
    try:
        rows = [(OPS[op], float(j)) for op, j in order]
    except Exception:  # noqa: BLE001 — not a list of ("F" | "B" | "W", j) pairs: the finding says what it was
        return None
    return np.array(rows, dtype=np.float64).reshape(-1, 2)


def zb_order(p: int, m: int, i: int, *, warm: int, delay: int, late_reversed: bool = False) -> Order:
    """ZB-H1's loop as a learner writes it: ``warm`` warm-up forwards, then F (while left) and B, and after each B
    from B ``delay`` on (and once no forward is left) the oldest W owed; the W's still owed at the end."""
    order = [("F", j) for j in range(warm)]
    w = 0
    for k in range(m):
        if warm + k < m:
            order.append(("F", warm + k))
        order.append(("B", k))
        if k >= delay or warm + k >= m:
            order, w = order + [("W", w)], w + 1
    left = [("W", j) for j in range(w, m)]
    return order + (left[::-1] if late_reversed else left)


def order_symptoms(p: int, m: int, i: int) -> dict:
    warm = min(p - i - 1, m)
    right = zb_order(p, m, i, warm=warm, delay=i)
    before = []
    for op, j in right:  # each W moved to just before its own B
        if op == "B":
            before.append(("W", j))
        if op != "W":
            before.append((op, j))
    fb = [a for a in right if a[0] != "W"]
    slips = {FUSED: zb_order(p, m, i, warm=warm, delay=0), W_LATE: zb_order(p, m, i, warm=warm, delay=i + 1),
             W_EARLY: zb_order(p, m, i, warm=warm, delay=i - 1),
             DELAY_REVERSED: zb_order(p, m, i, warm=warm, delay=p - 1 - i),
             W_AT_END: fb + [("W", j) for j in range(m)], W_BEFORE_B: before, NO_W: fb,
             EXTRA_WARMUP: zb_order(p, m, i, warm=min(p - i, m), delay=i),
             UNCAPPED: zb_order(p, m, i, warm=p - i - 1, delay=i),
             DRAIN_REVERSED: zb_order(p, m, i, warm=warm, delay=i, late_reversed=True)}
    return {sentence: as_rows(order) for sentence, order in slips.items()}


def measured(schedule: str, p: int, m: int, v: int):
    """The virtual clock's timeline of ``schedule`` (its bubble and its peaks in flight are the answers)."""
    return simulate(build(schedule, p, m, vp=v))


def bubble_symptoms(schedule: str, p: int, m: int, v: int, right: float) -> dict:
    plain = (p - 1) / (m + p - 1)
    slips = {IDLE_OVER_BUSY: right / (1 - right)}
    if schedule in ("1f1b", "interleaved"):
        slips[P_NOT_P_MINUS_1] = p / (v * m + p)
    if schedule == "interleaved" and v > 1:
        slips[V_FORGOTTEN], slips[V_OUTSIDE] = plain, plain / v
    if schedule == "zb-h1":
        slips[ZB_AS_1F1B], slips[ZB_THIRD] = plain, plain / 3
        slips[ZB_SMALL_M] = (p - 1) / (3 * m + p - 1)
    return slips


def peak_symptoms(schedule: str, p: int, m: int, v: int) -> dict:
    one_f_one_b = [min(p - i, m) for i in range(p)]
    megatron = [2 * (p - i - 1) + (v - 1) * p + 1 for i in range(p)]  # the interleaved count, uncapped
    if schedule == "1f1b":
        return {WARMUP_ONLY: [min(p - i - 1, m) for i in range(p)], PEAK_UNCAPPED: [p - i for i in range(p)],
                STAGE0_PEAK: [min(p, m)] * p}
    if schedule == "zb-h1":
        return {ZB_PEAK_AS_1F1B: one_f_one_b, PEAK_UNCAPPED: [p] * p}
    if v == 1:
        return {INTERLEAVED_AT_V1: [min(k, m) for k in megatron], WARMUP_ONLY: [min(p - i - 1, m) for i in range(p)]}
    return {INTERLEAVED_AS_1F1B: one_f_one_b, WARMUP_ONLY: [min(k - 1, v * m) for k in megatron],
            PEAK_UNCAPPED: megatron}


def live_interleaved(r: Report) -> tuple[float, list[float]]:
    """Interleaved 1F1B (v = 2, m = 8) on a pipeline of a tiny GPT, one stage per MPI rank: the bubble of the live
    clocks and every rank's peak of caches held, the same on every rank."""
    p = r.world_size
    schedule = build("interleaved", p, LIVE_M, vp=LIVE_V)
    grid = ProcessGrid(tp=1, pp=p, tracer=r.tracer)
    layers = p * LIVE_V
    cfg = GPTConfig(vocab_size=13, n_positions=6, n_embd=8, n_layer=layers, n_head=2)
    shard = pipeline_from_serial(architecture_of(cfg).serial(cfg, seed=18), grid, split_layers(layers, layers,
                                                                                               vp=LIVE_V))
    b, s = 2, 6
    ids = np.random.default_rng(18).integers(0, cfg.vocab, (b * LIVE_M, s))
    executor = Executor(schedule, shard.chunks, grid.pp_group, (b, s, cfg.hidden), np.float64)
    _, _, result = pipeline_grads(shard, executor, grid, None, ids, np.roll(ids, -1, axis=1),
                                  rows=np.arange(b * LIVE_M))
    mine = np.zeros((3, p))
    mine[:, r.rank] = result.clock.time, result.clock.busy, result.peak_in_flight
    with r.tracer.paused():
        every = grid.world.all_reduce(mine)
    _, bubble = bubble_measured(list(zip(every[0], every[1])))
    return bubble, every[2].tolist()


@exercise("18", "zb_h1_order", "bubble_fraction", "peak_in_flight",
          zb_h1_order=("ZB-H1 keeps 1F1B's forwards and backwards where lesson 17 put them (the warm-up, one F and "
                       "one B at a time, the B's left); only the W's are new. Where does stage i of 1F1B sit idle, "
                       "and what may a W wait for?",
                       "stage i runs the oldest W it owes after each B from B i on, and after every B once its "
                       "forwards are done; the W's still owed run last, in micro-batch order",
                       "warm = min(p − i − 1, m); F 0 .. warm − 1; for k in range(m): F warm + k if warm + k < m, "
                       "then B k, then W w (and w += 1) if k ≥ i or warm + k ≥ m; last W w .. m − 1"),
          bubble_fraction=("the bubble is the idle share of the step, Σ idle / (p · step): count one rank's busy "
                           "time (F 1, B 2; split B 1 and W 1; a chunk 1/v of a stage) and the step",
                           "1F1B idles (p − 1)(t_f + t_b) a rank; interleaving makes that v times shorter; ZB-H1 "
                           "idles p − 1 units a rank out of a step of 3m + p − 1 when m ≥ p",
                           "1f1b and interleaved: (p − 1)/(v·m + p − 1); zb-h1: (p − 1)/(3m + p − 1) if m ≥ p, "
                           "else (2p − 1 − m)/(2m + 2p − 1)"),
          peak_in_flight=("a rank holds a (micro-batch, chunk) from its F until its backward (until its W when the "
                          "backward is split): how many has it run just before its first backward frees one? It "
                          "can never hold more than there are",
                          "1F1B: the warm-up p − i − 1 and one more; interleaved with v > 1: Megatron-LM's warm-up "
                          "2(p − i − 1) + (v − 1)·p and one more; ZB-H1: every stage holds what stage 0 holds",
                          "1f1b, and interleaved at v = 1: min(p − i, m); interleaved, v > 1: "
                          "min(2(p − i − 1) + (v − 1)·p + 1, v·m); zb-h1: min(p, m) on every rank"))
def check_18(r: Report) -> None:
    for p, m in ORDER_CASES:
        for i in range(p):
            got = r.call("zb_h1_order", p, m, i)
            if i % r.world_size != r.rank:
                continue
            what = f"zb_h1_order(p={p}, m={m}, i={i}), as rows (op: F 0, B 1, W 2; micro-batch), one per action"
            rows = as_rows(got)
            if rows is None:
                r.require(False, what, f"your zb_h1_order returned {describe(got)}: return a list of (\"F\", j), "
                                       "(\"B\", j) and (\"W\", j) pairs, the op as the text F, B or W, then the "
                                       "micro-batch, in the order the stage runs them")
                continue
            r.compare(what, rows, as_rows(reference_order(p, m, i)), tol=0, symptoms=order_symptoms(p, m, i),
                      layout="rows")
    for k, (schedule, p, m, v) in enumerate(PREDICT_CASES):
        timeline = measured(schedule, p, m, v)
        got = r.call("bubble_fraction", schedule, p, m, v)
        if k % r.world_size == r.rank:
            right = timeline.bubble_fraction
            r.compare(f"bubble_fraction({schedule!r}, p={p}, m={m}, v={v}), against the virtual clock of "
                      "build(...) at unit costs", got, right, tol=1e-9,
                      symptoms=bubble_symptoms(schedule, p, m, v, right))
        got = r.call("peak_in_flight", schedule, p, m, v)
        if k % r.world_size == r.rank:
            r.compare(f"peak_in_flight({schedule!r}, p={p}, m={m}, v={v}), rank by rank, against the schedule's "
                      "lists", got, np.array(timeline.peak_in_flight, dtype=np.float64), tol=0,
                      symptoms=peak_symptoms(schedule, p, m, v), layout="rows")
    agreed = r.agree_on(OK)
    if agreed[BROKE]:
        raise Stop(WRONG, "")
    if agreed[FOUND]:
        return
    bubble, peaks = live_interleaved(r)  # every answer right on every rank: hold them to a live pipeline
    p = r.world_size
    got = r.call("bubble_fraction", "interleaved", p, LIVE_M, LIVE_V)
    if r.rank == 0:
        r.compare(f"bubble_fraction('interleaved', p={p}, m={LIVE_M}, v={LIVE_V}), against the live clocks of "
                  f"{p} MPI ranks running it", got, bubble, tol=1e-9,
                  symptoms=bubble_symptoms("interleaved", p, LIVE_M, LIVE_V, bubble))
    got = r.call("peak_in_flight", "interleaved", p, LIVE_M, LIVE_V)
    if r.rank == min(1, p - 1):
        r.compare(f"peak_in_flight('interleaved', p={p}, m={LIVE_M}, v={LIVE_V}), against the most caches each "
                  f"live executor held", got, np.array(peaks), tol=0,
                  symptoms=peak_symptoms("interleaved", p, LIVE_M, LIVE_V), layout="rows")
