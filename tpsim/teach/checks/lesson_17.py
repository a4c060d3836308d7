"""The check of exercise 17: stage i's 1F1B compute order and the micro-batches a stage holds, against
``tpsim.pipeline``, then on a live pipeline.

1. ``one_f_one_b_order(p, m, i)`` for every stage of many pipelines — one stage, fewer micro-batches than the
   warm-up would take, more — against the F and B actions of ``tpsim.pipeline.schedules.build("1f1b", ...)``.
   An order is compared as rows (op, micro-batch) with F = 0 and B = 1, one row per action, in order.
2. If every order was right on every rank: the learner's order of stage i runs on MPI rank i of a 4-stage
   pipeline of a tiny GPT (``tpsim.live_pipeline.executor``), and ``peak_in_flight`` of that order is compared with the
   peak of caches the live executor held.
3. ``peak_in_flight`` of 1F1B, AFAB and random legal orders against ``tpsim.pipeline.clock.in_flight``.

The functions are arithmetic: every process makes every call (a call is collective) and the process
``i % world`` compares stage i's answer (``k % world`` the k-th order of part 3), so each finding is reported
once. Each typical slip is written out below as the order it gives, so the check names it by what the
learner's result looks like (``tpsim.teach.diagnose``), never by the answer.
"""

from __future__ import annotations

import numpy as np

from tpsim.arch import GPTConfig, architecture_of
from tpsim.comm import ProcessGrid
from tpsim.pipeline.actions import COMPUTE, Action, Schedule, with_messages
from tpsim.pipeline.check import check
from tpsim.pipeline.clock import in_flight
from tpsim.pipeline.schedules import build
from tpsim.live_pipeline.build import pipeline_from_serial
from tpsim.live_pipeline.executor import Executor
from tpsim.live_pipeline.split import split_layers
from tpsim.live_pipeline.step import pipeline_grads
from tpsim.teach.checks.registry import exercise
from tpsim.teach.returned import describe
from tpsim.teach.verdict import BROKE, FOUND, OK, WRONG, Report, Stop

OPS = {"F": 0, "B": 1}
Order = list[tuple[str, int]]

EXTRA_WARMUP = ("your stage runs one forward too many before its first backward: its warm-up is one longer than "
                "it needs to be (the schedule still runs, but holds one micro-batch more than 1F1B)")
UNCAPPED = ("your warm-up is not capped by m: with fewer micro-batches than the warm-up would take, the stage "
            "runs forwards of micro-batches that do not exist (and backwards numbered below 0)")
AFAB = ("all the forwards, then all the backwards: that is GPipe's AFAB, which holds every micro-batch; 1F1B "
        "starts the backwards as soon as the first gradient can be back")
STAGE0_WARMUP = ("every stage got stage 0's warm-up: a later stage has fewer stages after it, so the first "
                 "gradient comes back to it sooner and its warm-up is shorter")
REVERSED_STAGES = ("your warm-up grows along the pipeline: it is the first stage that waits longest for its first "
                   "gradient, the last stage none at all")
DRAIN_REVERSED = ("the backwards after your last forward run in reverse micro-batch order: gradients come back in "
                  "the order the forwards went, so the drain goes up, not down")
BACKWARDS_REVERSED = ("your backwards run the micro-batches in reverse order: a stage's backwards go in the order "
                      "its forwards ran")
BACKWARD_FIRST = ("in the steady state your stage runs the backward before the forward: 1F1B takes the next "
                  "forward, then the oldest backward")

COUNTED_FORWARDS = ("you counted every forward: a backward frees its micro-batch's activations, so the count goes "
                    "down again")
FINAL_COUNT = ("you returned what the stage holds after its last action (nothing is left by then): the peak is "
               "the most it holds at any point")
BEFORE_FIRST_BACKWARD = ("you counted the forwards before the first backward: after it, forwards can still run "
                         "ahead of the backwards, and here they do")

# (p, m): one stage; m below, at and above the warm-ups; (4, 6) is also the live pipeline's
CASES = [(4, 8), (4, 2), (1, 1), (1, 5), (2, 1), (2, 6), (3, 7), (4, 4), (5, 5), (6, 2), (8, 3), (8, 16), (4, 6)]
LIVE_M = 6
RANDOM_ORDERS = [(3, 1), (5, 2), (7, 3), (9, 4), (6, 5), (12, 6)]  # (m, seed)


def reference_order(p: int, m: int, i: int) -> Order:
    """Stage i's compute actions of tpsim's 1F1B schedule."""
    return [(a.op, a.microbatch) for a in build("1f1b", p, m).ranks[i] if a.op in COMPUTE]


def as_rows(order) -> np.ndarray | None:
    """``[n, 2]`` rows (0 for F, 1 for B; the micro-batch), or None unless ``order`` is a list of (op, j) pairs."""
    try:
        rows = [(OPS[op], float(j)) for op, j in order]
    except Exception:  # noqa: BLE001 — not a list of ("F" | "B", j) pairs: the finding says what it was
        return None
    return np.array(rows, dtype=np.float64).reshape(-1, 2)


def warmed(m: int, warm: int) -> Order:
    """The 1F1B loop with ``warm`` warm-up forwards, as a learner writes it (an uncapped warm-up included)."""
    order = [("F", j) for j in range(warm)]
    for k in range(m - warm):
        order += [("F", warm + k), ("B", k)]
    return order + [("B", j) for j in range(m - warm, m)]


def order_symptoms(p: int, m: int, i: int) -> dict:
    warm = min(p - i - 1, m)
    right = warmed(m, warm)
    drain = right[:2 * m - warm] + right[2 * m - warm:][::-1]  # the last warm actions: the backwards left
    b_numbers = iter([j for op, j in right if op == "B"][::-1])
    reversed_backwards = [(op, next(b_numbers)) if op == "B" else (op, j) for op, j in right]
    backward_first = [("F", j) for j in range(warm)]
    for k in range(m - warm):
        backward_first += [("B", k), ("F", warm + k)]
    backward_first += [("B", j) for j in range(m - warm, m)]
    slips = {EXTRA_WARMUP: warmed(m, min(p - i, m)), UNCAPPED: warmed(m, p - i - 1),
             STAGE0_WARMUP: warmed(m, min(p - 1, m)), REVERSED_STAGES: warmed(m, min(i, m)),
             AFAB: [("F", j) for j in range(m)] + [("B", j) for j in range(m)],
             DRAIN_REVERSED: drain, BACKWARDS_REVERSED: reversed_backwards, BACKWARD_FIRST: backward_first}
    return {sentence: as_rows(order) for sentence, order in slips.items()}


def held(order: Order) -> int:
    """tpsim's count: the most (micro-batch, chunk) pairs held at once on a one-stage schedule of this order."""
    actions = tuple(Action(op, j) for op, j in order)
    return in_flight(Schedule("order", 1, len(actions) // 2, 1, (actions,)))[0]


def peak_symptoms(order: Order) -> dict:
    ops = [op for op, _ in order]
    first_b = ops.index("B") if "B" in ops else len(ops)
    return {COUNTED_FORWARDS: float(ops.count("F")), FINAL_COUNT: float(ops.count("F") - ops.count("B")),
            BEFORE_FIRST_BACKWARD: float(first_b)}


def random_order(m: int, seed: int) -> Order:
    """A legal order no schedule generator makes: forwards and backwards each in micro-batch order, B j after F j,
    interleaved at random."""
    rng = np.random.default_rng(seed)
    order, f, b = [], 0, 0
    while b < m:
        if f < m and (f == b or rng.random() < 0.5):
            order, f = order + [("F", f)], f + 1
        else:
            order, b = order + [("B", b)], b + 1
    return order


def live_peak(r: Report, mine: Order) -> int:
    """Run ``mine`` as this rank's stage of a 1F1B pipeline of a tiny GPT on every rank (stage = MPI rank);
    the peak of caches the executor held."""
    p = r.world_size
    lists = [reference_order(p, LIVE_M, i) for i in range(p)]
    lists[r.rank] = mine  # checked equal to the reference on this rank: the other stages run theirs
    schedule = Schedule("yours", p, LIVE_M, 1, tuple(with_messages(p, 1, i, [(op, j, 0) for op, j in lists[i]])
                                                      for i in range(p)))
    check(schedule)  # a one-line error, never a hang
    grid = ProcessGrid(tp=1, pp=p, tracer=r.tracer)
    cfg = GPTConfig(vocab_size=13, n_positions=6, n_embd=8, n_layer=p, n_head=2)
    shard = pipeline_from_serial(architecture_of(cfg).serial(cfg, seed=17), grid, split_layers(p, p))
    b, s = 2, 6
    ids = np.random.default_rng(17).integers(0, cfg.vocab, (b * LIVE_M, s))
    executor = Executor(schedule, shard.chunks, grid.pp_group, (b, s, cfg.hidden), np.float64)
    _, _, result = pipeline_grads(shard, executor, grid, None, ids, np.roll(ids, -1, axis=1),
                                  rows=np.arange(b * LIVE_M))
    return result.peak_in_flight


@exercise("17", "one_f_one_b_order", "peak_in_flight",
          one_f_one_b_order=("stage i can run forwards until the gradient of micro-batch 0 comes back; how many "
                             "stages come after stage i, and what if there are fewer micro-batches than that?",
                             "the last stage needs no warm-up (its own loss starts the backward) and each stage "
                             "before it one more, never more than m; then one forward and one backward while "
                             "forwards are left; then the backwards left, all in micro-batch order",
                             "warm = min(p − i − 1, m): F 0 .. warm − 1, then (F warm + k, B k) for k < m − warm, "
                             "then B m − warm .. m − 1"),
          peak_in_flight=("a forward adds a micro-batch's activations to what the stage holds; what takes them "
                          "away again?",
                          "walk the order with a count: one more at each F, one fewer at each B; the answer is the "
                          "largest the count gets",
                          "held = peak = 0; for op, j in order: held += 1 if op == 'F' else -1; "
                          "peak = max(peak, held)"))
def check_17(r: Report) -> None:
    live: Order | None = None
    for p, m in CASES:
        for i in range(p):
            got = r.call("one_f_one_b_order", p, m, i)
            if i % r.world_size != r.rank:
                continue
            what = f"one_f_one_b_order(p={p}, m={m}, i={i}), as rows (op: F 0, B 1; micro-batch), one per action"
            rows = as_rows(got)
            if rows is None:
                r.require(False, what, f"your one_f_one_b_order returned {describe(got)}: return a list of "
                                       "(\"F\", j) and (\"B\", j) pairs, the op as the text F or B, then the "
                                       "micro-batch, in the order the stage runs them")
                continue
            r.compare(what, rows, as_rows(reference_order(p, m, i)), tol=0, symptoms=order_symptoms(p, m, i),
                      layout="rows")
            if (p, m) == (r.world_size, LIVE_M) and i == r.rank:
                live = [("F" if op == 0 else "B", int(j)) for op, j in rows]
    agreed = r.agree_on(OK)
    if agreed[BROKE]:
        raise Stop(WRONG, "")
    if not agreed[FOUND] and live is not None:  # every order right on every rank: run them
        peak = live_peak(r, live)
        got = r.call("peak_in_flight", live)
        r.compare(f"peak_in_flight(your order of stage {r.rank}, p={r.world_size}, m={LIVE_M}), against the most "
                  f"caches the live executor held on MPI rank {r.rank}", got, float(peak), tol=0,
                  symptoms=peak_symptoms(live))
    orders = [reference_order(p, m, i) for p, m in ((4, 8), (8, 3), (3, 7)) for i in range(p)]
    orders += [reference_order(1, 4, 0), [("F", j) for j in range(5)] + [("B", j) for j in range(5)]]
    orders += [random_order(m, seed) for m, seed in RANDOM_ORDERS]
    for k, order in enumerate(orders):
        got = r.call("peak_in_flight", list(order))
        if k % r.world_size == r.rank:
            shown = " ".join(f"{op}{j}" for op, j in order[:8]) + (" ..." if len(order) > 8 else "")
            r.compare(f"peak_in_flight([{shown}]) ({len(order)} actions)", got, float(held(order)), tol=0,
                      symptoms=peak_symptoms(order))
