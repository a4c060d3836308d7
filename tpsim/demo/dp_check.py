"""The DP gradient buckets on the live virtual clock's comm stream against the planner's, decided on rank 0
(``tpsim.demo.tour``, ``--clock GPU`` at dp > 1):

    DP OVERLAP CHECK   each stage of rank 0's pipeline: the clock after the DP sync and the exposed DP seconds
                       (``tpsim.pipeline.overlap``: the wait for the comm stream before the optimizer) vs the
                       planner's ``tpsim.plan.dp_overlap`` for this run's buckets, to 1e-12 relative; ZeRO-1: the
                       exposed parameter all-gather too (``tpsim.plan.param_gather``)
    ZeRO-3 OVERLAP CHECK (``--zero 3``) each stage's all-gathers and reduce-scatters inside its F and B on the comm
                       stream (``tpsim.pipeline.prefetch``): their exposed seconds vs ``tpsim.plan.zero3_time``'s
    DP overlap: ...    the buckets, how much of their time is exposed, and the Ultra-Scale Playbook's condition
                       for hiding it all (t_compute ≥ t_comm)

Without a GPU clock (or at dp 1) there is nothing to price: no line.
"""

from __future__ import annotations

from tpsim.config import RunConfig
from tpsim.demo.pipeline_checks import duration
from tpsim.pipeline.overlap import playbook_hides
from tpsim.plan.dp_overlap import stream_dict
from tpsim.pipeline.stage_clock import ROUNDING
from tpsim.config.clock_choice import UNIT_CLOCK
from tpsim.plan.of_run import model_spec, run_layout


def overlap_line(stream: dict, buckets: int) -> str:
    """One line: the buckets, the exposed part of their time, and the Playbook's condition for hiding it."""
    holds = playbook_hides(stream["after_first_ready_s"], stream["comm_s"])
    return (f"DP overlap: {buckets} bucket{'s' * (buckets != 1)}, {duration(stream['exposed_s'])} of "
            f"{duration(stream['comm_s'])} exposed; hides fully when the backward left after the first bucket is "
            f"ready ({duration(stream['after_first_ready_s'])}) >= the DP communication (the Ultra-Scale "
            f"Playbook's t_compute >= t_comm): {'holds' if holds else 'does not hold'}")


def tp_overlap_lines(run: RunConfig) -> list[str]:
    """``--tp-comm-overlap`` on a GPU clock: one layer's pipelined collectives, what stays exposed, and the
    Playbook's condition for each to hide (per-chunk communication ≤ per-chunk GEMM, ``tpsim.plan.tp_overlap``)."""
    if run.pipeline.clock == UNIT_CLOCK or not run.parallel.tp_comm_overlap:
        return []
    from tpsim.plan.comm import links
    from tpsim.gpus import gpu as gpu_preset
    from tpsim.plan.tp_overlap import layer_summary

    lay, g = run_layout(run), gpu_preset(run.pipeline.clock)
    s = layer_summary(model_spec(run.model), lay, g, links(lay, g)["tp"])
    return [f"TP overlap: {s['count']} of a layer's SP collectives pipelined with their GEMMs, "
            f"{duration(s['exposed_s'])} of {duration(s['comm_s'])} exposed a micro-batch; each hides fully "
            f"when its per-chunk transfer <= its per-chunk GEMM (a/(t-1) <= g/t): {s['hiding']} of {s['count']} do"]


def overlap_words(run: RunConfig, grad_sync, tracer) -> str:
    """A run without a GPU clock: what the overlap flags did in the last step, from the trace, and where to see
    what they hide."""
    last = max((e.step for e in tracer.events), default=0)
    posted = [e for e in tracer.events if e.step == last and e.overlap]
    flags = " and ".join(f for f, on in (("--overlap-grad-reduce", run.optimizer.overlap_grad_reduce),
                                         ("--overlap-param-gather", run.optimizer.overlap_param_gather)) if on)
    if run.parallel.dp == 1:
        return f"DP overlap ({flags}): at dp 1 there is no DP collective to overlap"
    return (f"DP overlap ({flags}): rank 0 issued {len(posted)} DP collectives of step {last} to overlap compute "
            f"({len(grad_sync.buckets)} bucket(s); tests/mpi/test_dp_overlap.py holds such runs bit for bit to the "
            "plain ones); what they hide is priced on the virtual clock: add --clock GPU (e.g. --clock h100)")


def stream_of(clock, run: RunConfig) -> dict | None:
    """This rank's comm stream as the check reads it: ZeRO-3's exposed collectives inside the actions
    (``LiveClock.sharded_action``), else the DP buckets' stream (``stream_dict``) with ZeRO-1's exposed parameter
    all-gather; None without one."""
    if run.parallel.zero_stage.gathers_around_units:
        return {"sharded_exposed_s": clock.sharded_exposed, "spans": len(clock.sharded_spans)}
    return None if clock.dp is None else {**stream_dict(clock.dp), "param_gather_exposed_s": clock.gather_exposed}


def sharded_check(grid, run: RunConfig, streams: list[tuple], terms: dict) -> tuple[bool, list[str], dict]:
    """ZeRO-3 OVERLAP CHECK: each stage's exposed all-gathers and reduce-scatters inside its actions (the
    stream of ``tpsim.pipeline.prefetch``) against the planner's (``tpsim.plan.zero3_time``), to 1e-12 of the step."""
    live, chain = {rank: s for rank, _, s in streams}, list(grid.pp_group.ranks)
    got, want = [live[rank]["sharded_exposed_s"] for rank in chain], [r["zero3_s"] for r in terms["ranks"]]
    fp16 = run.precision.dtype == "float16"  # the planner's 16-bit gradients against tpsim's float32 (FP16_ZERO3)
    ok = fp16 or all(abs(g - w) <= ROUNDING * terms["step_s"] for g, w in zip(got, want))
    verdict, equal = ("not compared (float16: see the BUBBLE CHECK)", "") if fp16 else \
        ("MATCH", " (equal to 1e-12 of the step)") if ok else ("MISMATCH", " (NOT equal to 1e-12 of the step)")
    line = (f"ZeRO-3 OVERLAP CHECK: {verdict} — the all-gathers before each piece (one "
            f"prefetched ahead) and the reduce-scatters after, on the {run.pipeline.clock} clock's comm stream: "
            f"exposed per stage {', '.join(duration(x) for x in got)} of the step, the planner's "
            f"(tpsim.plan.zero3_time): {', '.join(duration(x) for x in want)}{equal}; "
            f"{live[chain[0]]['spans']} of them on rank {chain[0]}'s comm track")
    doc = {"zero": run.parallel.zero, "planner_exposed_s": want,
           "ranks": [{"rank": rank, "stage": stage, **(s or {})} for rank, stage, s in sorted(streams, key=str)]}
    return ok, [line], doc


def dp_check(grid, run: RunConfig, streams: list[tuple], dp_buckets: list) -> tuple[bool, list[str], dict | None]:
    """Rank 0: ``streams`` every rank's ``(rank, stage, stream dict or None)``; ``dp_buckets`` each stage's
    ``BucketSpec``s. ``(ok, lines, pipeline.json's "dp")``."""
    if run.pipeline.clock == UNIT_CLOCK or grid.dp == 1:
        return True, [], None
    from tpsim.gpus import gpu as gpu_preset
    from tpsim.plan.pipeline import pipeline_terms

    lay = run_layout(run)
    terms = pipeline_terms(model_spec(run.model), lay, gpu_preset(run.pipeline.clock), dp_buckets)
    if lay.zero_stage.gathers_around_units:
        return sharded_check(grid, run, streams, terms)
    want = terms["after_schedule"]["dp_streams"]
    live = {rank: s for rank, _, s in streams}
    chain = list(grid.pp_group.ranks)
    scale = terms["step_s"]
    gathers = terms["after_schedule"].get("param_gather")  # ZeRO-1: the all-gathers' exposed part too
    ok = all(live[rank] is not None and abs(live[rank]["end_s"] - want[r]["end_s"]) <= ROUNDING * scale
             and abs(live[rank]["exposed_s"] - want[r]["exposed_s"]) <= ROUNDING * scale
             and (gathers is None or abs(live[rank]["param_gather_exposed_s"] - gathers[r]["exposed_s"])
                  <= ROUNDING * scale)
             for r, rank in enumerate(chain))
    mode = "reduce-scattered every micro-batch as its backward finishes them (ZeRO-2)" \
        if lay.zero_stage.reduces_every_microbatch else \
        "overlapped with the last backward" if lay.overlap_grad_reduce else "after the backward"
    exposed = [live[rank]["exposed_s"] if live[rank] else float("nan") for rank in chain]
    line = (f"DP OVERLAP CHECK: {'MATCH' if ok else 'MISMATCH'} — the DP buckets {mode}, on the {run.pipeline.clock} "
            f"clock: exposed per stage {', '.join(duration(x) for x in exposed)}; the planner's "
            f"(tpsim.plan.dp_overlap): {', '.join(duration(w['exposed_s']) for w in want)} "
            f"({'equal' if ok else 'NOT equal'} to 1e-12 of the step)")
    if gathers is not None:
        mode = "waited at the forward" if lay.overlap_param_gather else "after the DP sync"
        line += (f"; ZeRO-{lay.zero}'s parameter all-gather ({mode}) exposed "
                 f"{', '.join(duration(live[rank]['param_gather_exposed_s']) for rank in chain)}, the planner's "
                 f"{', '.join(duration(g['exposed_s']) for g in gathers)}")
    first = live[chain[0]] or want[0]
    doc = {"overlap_grad_reduce": lay.overlap_grad_reduce, "overlap_param_gather": lay.overlap_param_gather,
           "planner_param_gather": gathers,
           "ranks": [{"rank": rank, "stage": stage, **(s or {})} for rank, stage, s in sorted(streams, key=str)],
           "planner": want}
    return ok, [line, overlap_line(first, len(dp_buckets[0]))], doc
