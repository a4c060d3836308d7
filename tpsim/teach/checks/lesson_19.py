"""The check of exercise 19: the exposed seconds of an overlapped DP gradient sync, and the Ultra-Scale
Playbook's inequality read bucket by bucket (lesson 19, "Exposed communication, and when it hides").

A backward makes bucket k's gradients ready at r_k; its all-reduce lasts d_k on a communication stream that runs
the buckets in order beside the compute, which ends at compute_end:

    start_k = max(r_k, end_{k−1}),   end_k = start_k + d_k,   exposed = max(0, end_last − compute_end)
    hides fully  ⇔  for every k:  compute_end − r_k ≥ d_k + … + d_last

1. ``exposed_dp_seconds(ready, durations, compute_end)`` on every bucket schedule of ``CASES`` (hand-picked:
   one bucket, buckets that queue, one ready at the very end, schedules that hide exactly; then drawn ones), all
   compared at once as one vector on rank 0, against the stream simulated here.
2. ``hides_fully(ready, durations, compute_end)`` on the same schedules, as a vector of 0/1 on the next rank,
   against whether the simulated stream ends by compute_end.
3. If every answer was right on every rank: one step of a tiny GPT on live ranks, PP 2 × DP 2 under 1F1B, the
   virtual clock at an H100's costs (``tpsim.plan.live_pipeline``), whose DP sync starts after the schedule —
   every bucket ready then, nothing overlapped. Each rank's buckets, read from its trace (scope ``ddp.bucket{i}``),
   priced as the clock prices them, go to ``exposed_dp_seconds``, which must give the clock's own DP sync span.

All values are multiples of 1/4, so every sum is exact and "exactly covered" is exactly 0. Every process makes
every call (a call is collective); each vector is compared by one process, so each finding is reported once.
Each typical slip is written out below as what it returns, so the check names it by what the learner's result
looks like (``tpsim.teach.diagnose``), never by the answer.
"""

from __future__ import annotations

import numpy as np

from tpsim.teach.checks.registry import exercise
from tpsim.teach.returned import as_numbers, describe
from tpsim.teach.verdict import BROKE, FOUND, OK, WRONG, Report, Stop

Case = tuple[list[float], list[float], float]

# --- slips of exposed_dp_seconds -------------------------------------------------------------------------------
NO_WAIT = ("your stream runs the buckets back to back from the first one's ready time, never waiting for a later "
           "bucket's gradients: a bucket's all-reduce cannot start before the backward has produced it")
FROM_FIRST_READY = ("you counted the exposure from the first bucket's ready time: that is how long the stream "
                    "ran, most of it beside the compute; only what runs past compute_end is exposed")
NOT_CLAMPED = ("your exposure goes negative when the stream ends before compute_end: a stream that finishes "
               "early exposes nothing, it does not give time back")
PARALLEL = ("your all-reduces run side by side, each from its own ready time: the communication stream runs "
            "them one after the other, so a bucket also waits for the one before it to end")
ALL_EXPOSED = ("yours is the sum of the all-reduces, as if none ran beside the backward: that is the sync "
               "without overlap; with a stream beside the compute only the part past compute_end is exposed")
LAST_ONLY = ("you counted only the last bucket's all-reduce: it is exposed, but so is whatever the buckets "
             "before it still had queued at compute_end")
SUM_OF_OVERRUNS = ("you added up every bucket's overrun past compute_end: the step waits once, until the "
                   "stream's last all-reduce ends, so the exposure is the last end's overrun alone")
LAST_FROM_READY = ("your last bucket starts at its ready time whatever is still on the stream: it waits for the "
                   "buckets before it to end too")

# --- slips of hides_fully ------------------------------------------------------------------------------------------
TOTAL_ONLY = ("your verdicts are the inequality taken once, for the whole backward after the first bucket is "
              "ready: they say it hides where a bucket that is ready late still runs past compute_end")
PER_BUCKET = ("your verdicts hold each bucket against its own all-reduce only: they say it hides where the "
              "buckets queued behind an earlier one still run past compute_end")
STRICT = ("your inequality is strict: a stream that ends exactly at compute_end exposes nothing, so equality "
          "hides fully")
LAST_BUCKET_ONLY = ("you checked only the last bucket: an early bucket with a long all-reduce can push the ones "
                    "behind it past compute_end")

HAND = [([1.0, 2.0, 3.0], [0.5, 0.5, 0.5], 5.0), ([1.0, 2.0, 3.0], [1.0, 1.0, 2.0], 5.0),
        ([1.0, 2.0, 5.0], [0.5, 0.5, 0.5], 5.0), ([0.0, 1.0, 2.0], [3.0, 1.0, 1.0], 4.0),
        ([0.0, 3.5, 4.0], [1.0, 1.0, 1.0], 4.5), ([2.0], [1.0], 2.5), ([0.5, 1.0, 1.5, 2.0], [0.25] * 4, 3.0),
        ([0.0, 0.5], [1.0, 1.0], 1.5), ([0.0, 2.0, 3.5], [3.0, 1.0, 0.25], 4.0), ([1.0, 4.0, 7.0], [0.5] * 3, 10.0),
        ([3.0], [0.75], 3.0), ([0.25, 0.5, 0.75, 1.0, 1.25], [1.0, 0.25, 0.25, 0.25, 0.25], 3.0)]


def drawn(n: int = 24, seed: int = 19) -> list[Case]:
    """Random schedules in quarters: 1–6 buckets ready in order, each all-reduce ¼–2, compute_end at or after the
    last ready time."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        k = int(rng.integers(1, 7))
        ready = np.cumsum(rng.integers(0, 5, k)) / 4
        durations = rng.integers(1, 9, k) / 4
        out.append((ready.tolist(), durations.tolist(), float(ready[-1] + rng.integers(0, 9) / 4)))
    return out


CASES: list[Case] = HAND + drawn()


def stream_ends(ready, durations, *, wait_ready: bool = True, wait_previous: bool = True,
                from_first: bool = False) -> list[float]:
    """Each all-reduce's end on a stream that waits for its bucket (``wait_ready``) and for the one before it
    (``wait_previous``); ``from_first``: a stream that starts at the first ready time and never waits again."""
    ends, end = [], -np.inf
    for k, (r, d) in enumerate(zip(ready, durations)):
        if from_first:
            start = ready[0] if k == 0 else end
        else:
            start = max(r if wait_ready else -np.inf, end if wait_previous else -np.inf)
        end = start + d
        ends.append(end)
    return ends


def reference_exposed(ready, durations, end) -> float:
    return max(0.0, stream_ends(ready, durations)[-1] - end)


def reference_hides(ready, durations, end) -> bool:
    return stream_ends(ready, durations)[-1] <= end


def exposed_symptoms() -> dict:
    def each(fn):
        return np.array([fn(*c) for c in CASES], dtype=np.float64)

    return {NO_WAIT: each(lambda r, d, e: max(0.0, stream_ends(r, d, from_first=True)[-1] - e)),
            FROM_FIRST_READY: each(lambda r, d, e: stream_ends(r, d)[-1] - r[0]),
            NOT_CLAMPED: each(lambda r, d, e: stream_ends(r, d)[-1] - e),
            PARALLEL: each(lambda r, d, e: max(0.0, max(x + y for x, y in zip(r, d)) - e)),
            ALL_EXPOSED: each(lambda r, d, e: sum(d)),
            LAST_ONLY: each(lambda r, d, e: d[-1]),
            SUM_OF_OVERRUNS: each(lambda r, d, e: sum(max(0.0, x - e) for x in stream_ends(r, d))),
            LAST_FROM_READY: each(lambda r, d, e: max(0.0, r[-1] + d[-1] - e))}


def hides_symptoms() -> dict:
    def each(fn):
        return np.array([float(fn(*c)) for c in CASES])

    return {TOTAL_ONLY: each(lambda r, d, e: e - r[0] >= sum(d)),
            PER_BUCKET: each(lambda r, d, e: all(e - x >= y for x, y in zip(r, d))),
            STRICT: each(lambda r, d, e: all(e - r[k] > sum(d[k:]) for k in range(len(r)))),
            LAST_BUCKET_ONLY: each(lambda r, d, e: e - r[-1] >= d[-1])}


def one_number(got, what: str, r: Report, allowed: str) -> float | None:
    """``got`` as one float, or None after a finding that says what it was instead."""
    numbers = as_numbers(got)
    if isinstance(numbers, str) or numbers[0].size != 1:
        r.require(False, what, f"your {r.function} returned {describe(got)}: return {allowed}")
        return None
    return float(numbers[0].reshape(-1)[0])


def live_sync(r: Report) -> tuple[list[float], list[float], float, float]:
    """One live step on PP 2 × DP 2 (the module docstring, 3.): this rank's ``(ready, durations, compute_end,
    the DP sync span's length)``, every bucket ready when its sync starts."""
    from tpsim.comm import ProcessGrid
    from tpsim.phases import DP_SYNC
    from tpsim.gpus import gpu
    from tpsim.plan.live_pipeline import one_step, pipeline_run
    from tpsim.plan.of_run import collective_seconds, run_layout

    run = pipeline_run(tp=1, dp=2, pp=2, schedule="1f1b", vp=1, microbatches=4, layers=4, clock="h100")
    grid = ProcessGrid(tp=1, dp=2, pp=2, tracer=r.tracer)
    result = one_step(run, grid)[0]  # (the executor's result, the shard, the sync)
    lay = run_layout(run)
    price = collective_seconds(lay, gpu(lay.gpu))
    calls = [e for e in grid.tracer.events if e.scope.startswith("ddp.bucket") and e.phase == DP_SYNC]
    durations = [price(e.op, e.group, e.group_size, e.wire_bytes) for e in calls]
    span = next(s for s in result.clock.spans if s.op == "DP sync")
    return [span.start] * len(calls), durations, span.start, span.end - span.start


@exercise("19", "exposed_dp_seconds", "hides_fully",
          exposed_dp_seconds=("follow the communication stream one bucket at a time: when can bucket k's "
                              "all-reduce start, when does it end, and which part of the stream does the step "
                              "wait for after compute_end?",
                              "bucket k starts at the later of its ready time and the previous bucket's end, and "
                              "lasts its duration; only what the last one runs past compute_end is exposed, never "
                              "less than 0",
                              "end = −∞; for r, d in zip(ready, durations): end = max(r, end) + d; "
                              "return max(0, end − compute_end)"),
          hides_fully=("hiding fully means the stream is done by compute_end; unroll the stream's end: which "
                       "bucket's ready time starts the chain of all-reduces that ends last?",
                       "the stream ends at max over k of r_k + d_k + … + d_last: every bucket k must have "
                       "compute_end − r_k ≥ d_k + … + d_last — not only the first, and with the ones queued behind "
                       "it; equality hides",
                       "return all(compute_end − ready[k] >= sum(durations[k:]) for k in range(len(ready)))"))
def check_19(r: Report) -> None:
    got = [r.call("exposed_dp_seconds", list(ready), list(d), end) for ready, d, end in CASES]
    if r.rank == 0:
        values = [one_number(g, f"exposed_dp_seconds on case {k}", r, "a number of seconds (a float)")
                  for k, g in enumerate(got)]
        if all(v is not None for v in values):
            right = np.array([reference_exposed(*c) for c in CASES])
            r.compare(f"exposed_dp_seconds on {len(CASES)} bucket schedules (ready, durations, compute_end), one "
                      "value each, against the in-order stream", np.array(values), right, tol=1e-9,
                      symptoms=exposed_symptoms())
    got = [r.call("hides_fully", list(ready), list(d), end) for ready, d, end in CASES]
    if r.rank == min(1, r.world_size - 1):
        values = [one_number(g, f"hides_fully on case {k}", r, "True or False") for k, g in enumerate(got)]
        if all(v is not None for v in values):
            if not all(v in (0.0, 1.0) for v in values):
                r.require(False, "hides_fully", "your hides_fully returned a number that is neither 0 nor 1: "
                                                "return True or False")
                return
            right = np.array([float(reference_hides(*c)) for c in CASES])
            r.compare(f"hides_fully on {len(CASES)} bucket schedules, one verdict each (1 = hides fully), against "
                      "whether the in-order stream ends by compute_end", np.array(values), right, tol=0,
                      symptoms=hides_symptoms())
    agreed = r.agree_on(OK)
    if agreed[BROKE]:
        raise Stop(WRONG, "")
    if agreed[FOUND]:
        return
    ready, durations, end, span = live_sync(r)  # every answer right on every rank: hold them to live ranks
    got = r.call("exposed_dp_seconds", ready, durations, end)
    if r.rank == 0:
        value = one_number(got, "exposed_dp_seconds on the live step's buckets", r, "a number of seconds (a float)")
        if value is not None:
            buckets = f"{len(durations)} bucket" + "s" * (len(durations) != 1)
            r.compare(f"exposed_dp_seconds on the {buckets} of a live PP 2 × DP 2 step ({r.world_size} MPI ranks, "
                      "every bucket ready when the schedule ends), against its virtual clock's DP sync", value, span,
                      tol=1e-9 * span)
