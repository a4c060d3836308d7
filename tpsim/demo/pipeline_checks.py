"""The live pipeline's own checks, decided on rank 0 of the demo (``tpsim.demo.tour``):

    PIPELINE CHECK   the peak of micro-batches in flight per stage vs ``tpsim.predict.pipeline.peak_in_flight``
    BUBBLE CHECK     the last step on the live virtual clock (``tpsim.live_pipeline.clock``): under ``--clock unit`` the
                     idle share vs (p − 1)/(v·m + p − 1) exactly (1e-9; zb-h1:
                     (p − 1)/(3m + p − 1), m ≥ p); under ``--clock GPU`` the makespan, the idle share and the
                     step (the collectives around the schedule included: ``tpsim.live_pipeline.step``) vs the planner's
                     timeline of the same layout (1e-12 relative), the unit formula beside it with the reasons
                     they differ (uneven stages, the LM head, collectives, messages); ``pipeline.json``
    P2P bytes        what rank 0's pipeline sent in a step, from the records, and the formula in words
"""

from __future__ import annotations

from tpsim.config import RunConfig
from tpsim.pipeline.stage_clock import ROUNDING
from tpsim.config.clock_choice import UNIT_CLOCK
from tpsim.plan.of_run import clock_words, model_spec, run_layout
from tpsim.live_pipeline.clock import bubble_measured
from tpsim.predict.pipeline import bubble_fraction, peak_in_flight


def peak_formula(schedule: str, vp: int) -> str:
    """The formula ``tpsim.predict.pipeline.peak_in_flight`` computes, in words."""
    if schedule == "afab":
        return "m"
    if schedule == "zb-h1":
        return "min(p, m)"
    return "min(2(p − i − 1) + (v − 1)·p + 1, v·m)" if vp > 1 else "min(p − i, m)"


def bubble_name(schedule: str, pp: int, m: int, vp: int) -> str:
    """The bubble formula ``tpsim.predict.pipeline.bubble_fraction`` computes for this pipeline, in words."""
    if schedule == "zb-h1":
        return "(p − 1)/(3m + p − 1)" if m >= pp else "(2p − 1 − m)/(2m + 2p − 1) (m < p)"
    return "(p − 1)/(m + p − 1)" if vp == 1 else "(p − 1)/(v·m + p − 1)"


def pipeline_check(grid, run: RunConfig, peaks: list[int] | None) -> tuple[bool, str]:
    """Rank 0: the peak of micro-batches in flight per stage against the schedule's formula."""
    pipe = run.pipeline
    want = peak_in_flight(pipe.schedule, grid.pp, pipe.microbatches, pipe.vp)
    ok = peaks == want
    held = "(micro-batch, chunk) pairs" if pipe.vp > 1 else "micro-batches"
    freed = "each W ran: B keeps W's inputs" if pipe.schedule == "zb-h1" else "each backward ran"
    return ok, (f"PIPELINE CHECK: {'MATCH' if ok else 'MISMATCH'} — peak {held} in flight per stage "
                f"{peaks}, {pipe.schedule}'s {peak_formula(pipe.schedule, pipe.vp)} = {want} (activations freed as "
                f"{freed})")


HALF_CACHES = ("tpsim's 16-bit layers keep LayerNorm's x-hat, the GeLU input and the softmax probabilities in float32 "
               "(the fused-kernel inputs), where Korthikanti et al. count 2 bytes")


def activation_check(run: RunConfig, held: list[int]) -> tuple[bool, str]:
    """Rank 0: each stage's peak bytes of layer activations held (``tpsim.live_pipeline.in_flight``, rank 0's pipeline)
    against the planner's ``activation_peaks`` of this layout — the schedule's pairs in flight × each chunk's layers ×
    one layer's bytes (Korthikanti et al. 2022, Table 2, + tpsim's norms' rstd). 16-bit runs and a GPT at
    dropout 0 (the paper's count assumes dropout): reported only, with the reason."""
    from tpsim.plan.memory import activation_peaks

    if getattr(run.model, "num_local_experts", 0):
        return True, (f"ACTIVATION CHECK: not compared — peak layer activations held per stage {held} bytes; a MoE "
                      "layer's depend on how many tokens each expert got (the routing), which no formula fixes")
    want = [round(x) for x in activation_peaks(model_spec(run.model), run_layout(run), "total")]
    shown = f"peak layer activations held per stage {held} bytes"
    if run.precision.dtype in ("bfloat16", "float16"):
        return True, f"ACTIVATION CHECK: not compared — {shown}; {HALF_CACHES}"
    if run.model.has_dropout and not run.model.dropout:
        return True, (f"ACTIVATION CHECK: not compared — {shown}; at dropout 0 tpsim keeps no dropout masks or "
                      "outputs, where Korthikanti et al. always count them")
    ok = held == want
    return ok, (f"ACTIVATION CHECK: {'MATCH' if ok else 'MISMATCH'} — {shown}, the planner's in flight × layers × "
                f"a layer's bytes (tpsim.plan.memory.activation_peaks) = {want}")


def p2p_sent(grid, records: list[dict], step: int) -> int:
    """Bytes rank 0's pipeline (one DP replica, one TP rank) sent in ``step``, from the records."""
    chain = set(grid.pp_group.ranks)
    return sum(r["bytes"] for r in records
               if r["op"] == "send" and r["group"] == "pp" and r["rank"] in chain and r["step"] == step)


BUBBLE_TOLERANCE = 1e-9
FP16_STEP = ("; the step not compared: the planner's float16 gradients are Megatron's 16-bit ones, tpsim's float16 "
             "all-reduces float32 main gradients after the schedule")

FP16_ZERO3 = ("{check} CHECK: not compared — float16 under ZeRO-3 on the {clock} clock: the live pipeline idled "
              "{measured:.6f} of its {span} schedule, the planner's {want:.6f} of {want_span}; the planner's float16 "
              "gradients are Megatron's 16-bit ones, tpsim's float16 reduce-scatters float32 main gradients inside "
              "every backward")


def duration(x: float) -> str:
    """Modelled seconds in a readable unit: ``12.2 µs``."""
    for unit, scale in (("s", 1), ("ms", 1e-3), ("µs", 1e-6)):
        if abs(x) >= scale:
            return f"{x / scale:.4g} {unit}"
    return f"{x * 1e9:.4g} ns"


def why_not_formula(terms: dict, run: RunConfig) -> str:
    """Why a GPU clock's bubble is not the unit formula's, from the planner's timeline of the same layout: the
    formula assumes equal stages and free messages."""
    busy = [r["busy_s"] for r in terms["ranks"]]
    slow = max(range(len(busy)), key=busy.__getitem__)
    reasons = []
    if busy[slow] > min(busy) * (1 + ROUNDING):
        head = " (it holds the LM head)" if slow == len(busy) - 1 else ""
        uneven = len(set(run.pipeline.stage_layers or ())) > 1
        reasons.append(f"rank {slow}{head} is busy {busy[slow] / min(busy) - 1:.1%} longer than the least busy rank"
                       + (", stages uneven (--pp-layers)" if uneven else "") + ", and the others wait for it")
    inside = terms["makespan_without_p2p_s"] - terms["makespan_compute_only_s"]
    if inside > ROUNDING * terms["makespan_s"]:
        reasons.append(f"the collectives inside F, B and W add {duration(inside)}")
    exposed = terms["makespan_s"] - terms["makespan_without_p2p_s"]
    if exposed > ROUNDING * terms["makespan_s"]:
        reasons.append(f"the messages add {duration(exposed)} of its {duration(terms['makespan_s'])} makespan")
    return "; ".join(reasons) or "every rank is equally busy and no message waits on the critical path"


def bubble_check(grid, run: RunConfig, timing: list[tuple], records: list[dict], step: int,
                 dp_buckets: list[list[int]] | None = None) -> tuple[bool, str, dict]:
    """Rank 0: the last step's bubble on the live clock, measured on rank 0's pipeline; ``(ok, BUBBLE CHECK line,
    pipeline.json's content)``. ``timing``: every rank's (rank, stage, schedule end, busy, peak in flight, peak
    layer bytes, step end). Unit clock: the idle share vs (p − 1)/(v·m + p − 1) to 1e-9. GPU clock: the makespan,
    the idle share and the step vs the planner's timeline of the same layout to 1e-12 relative (``ROUNDING``: the
    planner sums the same costs in another order), the unit formula beside it with why they differ.
    ``dp_buckets``: each stage's DP gradient buckets in bytes (this run's), which the planner then prices one
    collective each."""
    from tpsim.gpus import gpu as gpu_preset
    from tpsim.plan.pipeline import pipeline_terms
    from tpsim.predict.pipeline_comm import p2p_bytes_formula

    pipe, chain = run.pipeline, grid.pp_group.ranks
    clocks = {rank: (end, busy) for rank, _, end, busy, *_ in timing}
    end, measured = bubble_measured([clocks[r] for r in chain])
    total = max(t[6] for t in timing if t[0] in chain)  # the step: the collectives after the schedule too
    formula = bubble_fraction(pipe.schedule, grid.pp, pipe.microbatches, pipe.vp)
    words, gpu = clock_words(run), pipe.clock != UNIT_CLOCK
    doc = {"schedule": pipe.schedule, "pp": grid.pp, "vp": pipe.vp, "microbatches": pipe.microbatches,
           "clock": words, "clock_gpu": pipe.clock if gpu else None, "mfu": pipe.mfu,
           "time_unit": "s" if gpu else "unit", "step": step, "makespan": end, "step_time": total,
           "bubble_fraction": {"measured": measured, "formula": formula},
           "p2p_bytes": {"measured": p2p_sent(grid, records, step), "formula": p2p_bytes_formula(run)},
           "ranks": [{"rank": rank, "stage": stage, "busy_s": busy, "idle_s": end - busy, "peak_in_flight": peak,
                      "peak_layer_bytes": held} for rank, stage, _, busy, peak, held, _ in sorted(timing)]}
    name = bubble_name(pipe.schedule, grid.pp, pipe.microbatches, pipe.vp)
    if not gpu:
        ok = abs(measured - formula) <= BUBBLE_TOLERANCE
        costs = ("F 1, B 1, W 1" if pipe.schedule == "zb-h1" else "F 1, B 2" if pipe.vp == 1
                 else f"F 1, B 2 a stage; a chunk 1/{pipe.vp} of that")
        line = (f"BUBBLE CHECK: {'MATCH' if ok else 'MISMATCH'} — on the unit clock ({costs}) the pipeline of ranks "
                f"{list(chain)} idled {measured:.6f} of its {end:g}-unit step; {name} = {formula:.6f}")
        return ok, line, doc
    terms = pipeline_terms(model_spec(run.model), run_layout(run), gpu_preset(pipe.clock), dp_buckets)
    want, want_bubble, want_step = terms["makespan_s"], terms["bubble_fraction"]["measured"], terms["step_s"]
    fp16 = run.precision.dtype == "float16"  # the planner's float16 gradients are Megatron's 2 bytes
    if fp16 and run.parallel.zero_stage.gathers_around_units:  # ... and ZeRO-3 reduce-scatters them in every backward
        return True, FP16_ZERO3.format(check="BUBBLE", clock=pipe.clock, measured=measured, span=duration(end),
                                       want=want_bubble, want_span=duration(want)), doc
    ok = (abs(end - want) <= ROUNDING * want and abs(measured - want_bubble) <= ROUNDING
          and (fp16 or abs(total - want_step) <= ROUNDING * want_step))
    doc["planner"] = {key: terms[key] for key in ("makespan_s", "makespan_without_p2p_s", "makespan_compute_only_s",
                                                  "step_s")}
    doc["planner"]["bubble_fraction"] = want_bubble
    line = (f"BUBBLE CHECK: {'MATCH' if ok else 'MISMATCH'} — on the {pipe.clock} clock the pipeline of ranks "
            f"{list(chain)} idled {measured:.6f} of its {duration(end)} schedule, its step {duration(total)} with "
            f"the collectives after it; the planner's clock of this layout (tpsim.plan.pipeline): {want_bubble:.6f} "
            f"of {duration(want)}, step {duration(want_step)} ({'equal' if ok else 'NOT equal'} to 1e-12 "
            f"relative{FP16_STEP if fp16 else ''}). The unit formula {name} = {formula:.6f} assumes equal stages "
            "and free messages: " + why_not_formula(terms, run))
    return ok, line, doc


def p2p_formula(run: RunConfig) -> str:
    """The p2p bytes formula in words (``tpsim.predict.pipeline_comm.p2p_bytes_formula`` computes it)."""
    stages = "(v·p − 1)" if run.pipeline.vp > 1 else "(p − 1)"
    return f"2·m·{stages}·b·s·h·e" + (" ÷ t" if run.parallel.sp else "")
