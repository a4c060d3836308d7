"""What must hold of any spans a clock of tpsim produces, whatever its costs: each rule broken is one line.

    one stream, one thing at a time   spans on a rank's compute stream, or on its comm stream, never overlap and
                                      never end before they start
    nothing before its input          no DP bucket's collective starts before the bucket is ready
    time adds up                      busy + idle = the step on every rank, idle ≥ 0; a stream's exposed time is
                                      its end − the compute's end, never negative

``reference_clock.invariants`` states the same of the reference's spans, and that no forward piece starts
before every all-gather of its parameters has ended (the spans of a clock do not show pieces). ``ROUNDING``:
what the same seconds summed in another order can differ by, relative to the step.
"""

from __future__ import annotations

ROUNDING = 1e-12


def _ordered(name: str, spans, scale: float) -> list[str]:
    slack = ROUNDING * scale
    out = [f"{name}: {s} ends before it starts" for s in spans if s[-1] < s[-2] - slack]
    return out + [f"{name}: {b} starts before {a} ends" for a, b in zip(spans, spans[1:]) if b[-2] < a[-1] - slack]


def timeline_problems(timeline) -> list[str]:
    """``tpsim.pipeline.clock.simulate``'s timeline: each rank's actions one after another, busy + idle = step."""
    out, step = [], timeline.step
    for r, spans in enumerate(timeline.spans):
        out += _ordered(f"rank {r}", [tuple(s) for s in spans], step)
    for r, (busy, idle) in enumerate(zip(timeline.busy, timeline.idle)):
        if abs(busy + idle - step) > ROUNDING * step or idle < -ROUNDING * step:
            out.append(f"rank {r}: busy {busy} + idle {idle} is not the step {step}")
    return out


def stream_problems(stream, name: str = "comm stream") -> list[str]:
    """A DP comm stream — a ``tpsim.pipeline.overlap.Stream``, or the dict ``tpsim plan --json`` and
    ``pipeline.json`` write — one bucket at a time, none before it is ready, its exposed time its end − the
    compute's."""
    if isinstance(stream, dict):
        spans = [(b["bucket"], b["ready"], b["start"], b["end"]) for b in stream["buckets"]]
        end, compute_end, exposed = stream["end_s"], stream["compute_end_s"], stream["exposed_s"]
    else:
        spans = [(s.bucket, s.ready, s.start, s.end) for s in stream.spans]
        end, compute_end, exposed = stream.end, stream.compute_end, stream.exposed
    scale = max(end, 1e-300)
    out = _ordered(name, [(b, start, stop) for b, _, start, stop in spans], scale)
    out += [f"{name}: bucket {b} starts at {start}, before it is ready at {ready}" for b, ready, start, _ in spans
            if start < ready]
    if exposed < -ROUNDING * scale or abs(end - compute_end - exposed) > ROUNDING * scale:
        out.append(f"{name}: exposed {exposed} is not its end {end} − the compute's {compute_end}")
    return out


def clock_problems(clock) -> list[str]:
    """One rank's ``tpsim.live_pipeline.clock.LiveClock`` after a step: its spans one after another, its DP buckets'
    stream (``stream_problems``), busy within the step."""
    scale = max(clock.time, 1e-300)
    out = _ordered(f"rank {clock.rank}", [(s.op, s.microbatch, s.start, s.end) for s in clock.spans], scale)
    if clock.dp is not None:
        out += stream_problems(clock.dp, f"rank {clock.rank} DP stream")
    if clock.busy > clock.time * (1 + ROUNDING):
        out.append(f"rank {clock.rank}: busy {clock.busy} exceeds its clock {clock.time}")
    return out
