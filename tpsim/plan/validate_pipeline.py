"""``tpsim plan --validate``'s pipeline cases: live pipeline ranks against the planner's pipeline terms.

Each case launches ``python -m tpsim.plan.live_pipeline`` (the toy GPT or Llama cut into stages, one traced step,
the live virtual clock charging the planner's costs on a GPU, collectives included: ``tpsim.plan.of_run``) and
compares, for the same model and layout (``run_layout`` of the same ``RunConfig``), on every rank:

    virtual makespan        each pipeline's latest clock at the  vs  pipeline_terms' makespan   (1e-12 relative)
                            end of its schedule (TP collectives inside F, B, W priced)
    virtual step time       each pipeline's latest clock after   vs  pipeline_terms' step_s     (1e-12 relative)
                            the DP sync (the loss, embedding and DP collectives at their group's latest clock)
    TP collectives on the   each rank's clock time inside F, B   vs  m × Σ stage_comm of the    (1e-12 relative)
    clock                   and W spent on collectives (the        rank's chunks; under
                            exposed time of pipelined ones)        --tp-comm-overlap the exposed TP time
    p2p bytes per replica   the trace's sends of each pipeline   vs  pipeline_terms' p2p bytes  (exactly)
    peak in flight          each rank's most pairs held          vs  the schedule's, per rank   (exactly)
    layer activations held  each rank's peak bytes of its blocks'  vs  activation_peaks: pairs in  (exactly)
                            caches in flight (tpsim.live_pipeline.in_flight)         flight × layers × Korthikanti's
                                                                     bytes a layer + tpsim's rstd
    embedding all-reduce    the trace's tied-embedding records   vs  embedding_collectives      (exactly)
                            (scope transformer.wte, phase dp_sync; wire bytes of one GPU of each stage)
    exposed DP seconds      each rank's wait for its comm stream  vs  dp_overlap's, per stage   (1e-12 of the step)
                            (the run's own buckets: bytes and       (tpsim.plan.dp_overlap, the same rule:
                            the piece finishing each)               tpsim.pipeline.overlap)
    bubble fraction         each pipeline's idle share             vs  pipeline_terms' measured  (1e-12)

The overlap cases (``--overlap-grad-reduce``; ZeRO-1 with ``--overlap-param-gather`` too) report their buckets,
their exposed DP seconds and (ZeRO-1) the exposed parameter all-gather (the forward's waits for it: ``exposed
param all-gather``); the planner prices those buckets. The ZeRO-2 case's reduce-scatters run every micro-batch
from the pieces that finish their buckets (``tpsim.pipeline.overlap.zero2_stream``); the ZeRO-3 case's all-gathers
and reduce-scatters inside each F, B and W (``tpsim.pipeline.prefetch``), whose exposed seconds are compared too.

The step time is a float sum: the planner adds a message's α + β·bytes once where a live receiver adds α, then
β·bytes, to the sender's stamp, so the two may differ in the last bits — 1e-12 relative is the bound
(``tpsim.pipeline.stage_clock.ROUNDING``); the rest are integers. A case whose schedule the live pipeline cannot
run is not launched: it is printed with the configuration's own refusal. Every schedule runs live today, ZB-H1
included (its chunks split each backward into B and W, ``tpsim.nn.module.deferred_weight_grads``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from tpsim.cost import wire_bytes
from tpsim.errors import ConfigError
from tpsim.launcher import launch
from tpsim.pipeline.stage_clock import ROUNDING
from tpsim.plan.comm import EMBEDDING_GROUP, embedding_collectives
from tpsim.plan.memory import activation_peaks
from tpsim.gpus import gpu as gpu_preset
from tpsim.plan.live_pipeline import pipeline_run
from tpsim.plan.of_run import model_spec, run_layout
from tpsim.plan.pipeline import pipeline_terms
from tpsim.pipeline.overlap import BucketSpec
from tpsim.live_pipeline.clock import bubble_measured

CLOCK = "h100-80gb"


@dataclass(frozen=True)
class PipelineCase:
    """One live pipeline: TP × DP × PP ranks, its schedule, vp, micro-batches and layers of the toy GPT."""

    name: str
    tp: int
    dp: int
    pp: int
    schedule: str
    vp: int = 1
    microbatches: int = 4
    layers: int = 4
    sp: bool = False
    arch: str = "gpt2"
    tp_comm_overlap: bool = False
    zero: int = 0
    overlap: str = ""  # "grad": --overlap-grad-reduce; "both": and --overlap-param-gather (ZeRO-1)
    bucket_mb: float = 25.0

    @property
    def ranks(self) -> int:
        return self.tp * self.dp * self.pp

    def run(self):
        """The ``RunConfig`` the worker runs and the planner prices (ConfigError: the live ranks cannot run it)."""
        return pipeline_run(self.tp, self.dp, self.pp, self.schedule, self.vp, self.microbatches, self.layers, CLOCK,
                            self.sp, self.arch, self.tp_comm_overlap, zero=self.zero, overlap=self.overlap,
                            bucket_mb=self.bucket_mb)


PIPELINE_CASES = [PipelineCase("PP 2 x TP 2, 1f1b", 2, 1, 2, "1f1b", layers=2),
                  PipelineCase("PP 2 x DP 2, interleaved vp 2", 1, 2, 2, "interleaved", vp=2),
                  PipelineCase("PP 4, afab", 1, 1, 4, "afab"),
                  PipelineCase("PP 4, zb-h1", 1, 1, 4, "zb-h1"),
                  PipelineCase("PP 2 x TP 2, zb-h1, SP", 2, 1, 2, "zb-h1", layers=2, sp=True),
                  PipelineCase("Llama PP 2 x TP 2, 1f1b", 2, 1, 2, "1f1b", layers=2, arch="llama"),
                  PipelineCase("PP 2 x TP 2, 1f1b, SP, --tp-comm-overlap", 2, 1, 2, "1f1b", layers=2, sp=True,
                               tp_comm_overlap=True),
                  PipelineCase("PP 1 x TP 2 x DP 2, overlap grad reduce", 2, 2, 1, "1f1b", microbatches=1, layers=2,
                               overlap="grad", bucket_mb=0.004),
                  PipelineCase("PP 2 x DP 2, 1f1b, overlap grad reduce", 1, 2, 2, "1f1b", overlap="grad",
                               bucket_mb=0.004),
                  PipelineCase("PP 2 x DP 2, zb-h1, ZeRO-1, both overlaps", 1, 2, 2, "zb-h1", zero=1, overlap="both",
                               bucket_mb=0.004),
                  PipelineCase("PP 2 x DP 2, 1f1b, ZeRO-2", 1, 2, 2, "1f1b", zero=2, bucket_mb=0.004),
                  PipelineCase("PP 2 x DP 2, zb-h1, ZeRO-3", 1, 2, 2, "zb-h1", zero=3)]


def skipped(case: PipelineCase) -> str | None:
    """Why the live ranks cannot run ``case`` (the configuration's one line), or None."""
    try:
        case.run()
    except ConfigError as err:
        return str(err)
    return None


def run_pipeline_case(case: PipelineCase, folder: Path, timeout: float = 120) -> list[dict]:
    path = folder / (f"pipeline_{case.arch}_{case.schedule}_pp{case.pp}_tp{case.tp}_dp{case.dp}"
                     + "_sp" * case.sp + "_overlap" * case.tp_comm_overlap
                     + f"_zero{case.zero}_{case.overlap or 'plain'}_{case.bucket_mb:g}.json")
    args = ["-m", "tpsim.plan.live_pipeline", "--tp", str(case.tp), "--dp", str(case.dp), "--pp", str(case.pp),
            "--schedule", case.schedule, "--vp", str(case.vp), "--microbatches", str(case.microbatches),
            "--layers", str(case.layers), "--arch", case.arch, "--clock", CLOCK, "--json", str(path)]
    args += ["--sp"] * case.sp + ["--tp-comm-overlap"] * case.tp_comm_overlap
    args += ["--zero", str(case.zero), "--bucket-mb", repr(case.bucket_mb)]
    args += ["--overlap", case.overlap] * bool(case.overlap)
    run = launch(case.ranks, args, timeout=timeout)
    if run.returncode:
        raise RuntimeError(f"{case.name}: mpiexec exited with {run.returncode}\n"
                           f"{run.stdout[-2000:]}{run.stderr[-2000:]}")
    return json.loads(path.read_text())


def pipelines(ranks: list[dict]) -> dict[tuple[int, int], list[dict]]:
    """The ranks of every pipeline (one per DP replica and TP rank), in pipeline-rank order."""
    out: dict[tuple[int, int], list[dict]] = {}
    for r in sorted(ranks, key=lambda r: r["pp_rank"]):
        out.setdefault((r["dp_rank"], r["tp_rank"]), []).append(r)
    return out


def _row(case, term, want, got, ok, fmt="{:,.0f}"):
    shown = " / ".join(fmt.format(x) for x in sorted(set(got)))
    return case.name, term, " / ".join(fmt.format(x) for x in sorted(set(want))), shown, ok


def check_pipeline_case(case: PipelineCase, ranks: list[dict]) -> list[tuple[str, str, str, str, bool]]:
    """``(case, term, planner, measured (every rank or pipeline), ok)`` for every pipeline term of one case."""
    run = case.run()
    model, lay = model_spec(run.model), run_layout(run)
    chains = list(pipelines(ranks).values())
    buckets = [[BucketSpec(n, stage, tuple(piece), held, (first[0], tuple(first[1])))
                for n, stage, piece, held, first in r["buckets"]]
               for r in chains[0]] if "buckets" in chains[0][0] else None  # this run's own buckets
    terms = pipeline_terms(model, lay, gpu_preset(lay.gpu), buckets)
    rows = []
    for term, key, want in (("virtual makespan (s, 1e-12 rel.)", "schedule_end", terms["makespan_s"]),
                            ("virtual step time (s, 1e-12 rel.)", "clock_end", terms["step_s"])):
        got = [max(r[key] for r in chain) for chain in chains]
        rows.append(_row(case, term, [want], got, all(abs(t - want) <= ROUNDING * want for t in got), "{:.12g}"))
    tp_s = [lay.microbatches * sum(s["F_collectives_s"] + s["B_collectives_s"] + s["W_collectives_s"]
                                   for s in terms["stages"] if s["rank"] == r["pp_rank"]) for r in ranks]
    rows.append(_row(case, "TP collectives on the clock per rank (s, 1e-12 rel.)", tp_s,
                     [r["clock_collectives"] for r in ranks],
                     all(abs(r["clock_collectives"] - t) <= ROUNDING * max(t, 1e-300) for r, t in zip(ranks, tp_s)),
                     "{:.12g}"))
    if "dp_exposed" in ranks[0]:  # the DP buckets on the comm stream: each rank's exposed seconds
        want = [s["exposed_s"] for s in terms["after_schedule"].get("dp_streams", [{"exposed_s": 0.0}] * case.pp)]
        got = [r["dp_exposed"] for r in ranks]
        scale = terms["step_s"]
        rows.append(_row(case, "exposed DP seconds (1e-12 of the step)", want, got,
                         all(abs(r["dp_exposed"] - want[r["pp_rank"]]) <= ROUNDING * scale for r in ranks), "{:.12g}"))
        gathers = terms["after_schedule"].get("param_gather")
        if gathers is not None:  # ZeRO-1: the parameter all-gather's exposed part (the forward's waits, or all)
            want = [g["exposed_s"] for g in gathers]
            rows.append(_row(case, "exposed param all-gather (1e-12 of the step)", want,
                             [r["gather_exposed"] for r in ranks],
                             all(abs(r["gather_exposed"] - want[r["pp_rank"]]) <= ROUNDING * scale for r in ranks),
                             "{:.12g}"))
        if lay.zero_stage.gathers_around_units:  # ZeRO-3's collectives inside F, B and W: the stream's exposed part
            want = [terms["ranks"][r["pp_rank"]]["zero3_s"] for r in ranks]
            rows.append(_row(case, "exposed ZeRO-3 collectives (1e-12 of the step)", want,
                             [r["sharded_exposed"] for r in ranks],
                             all(abs(r["sharded_exposed"] - w) <= ROUNDING * scale for r, w in zip(ranks, want)),
                             "{:.12g}"))
        bubble = terms["bubble_fraction"]["measured"]
        got = [bubble_measured([(r["schedule_end"], r["clock_busy"]) for r in chain])[1] for chain in chains]
        rows.append(_row(case, "bubble fraction (1e-12)", [bubble], got,
                         all(abs(b - bubble) <= ROUNDING for b in got), "{:.12g}"))
    sent = [sum(r["p2p_sent"] for r in chain) for chain in chains]
    p2p = terms["p2p_bytes"]["measured"]
    rows.append(_row(case, "p2p bytes per replica", [p2p], sent, set(sent) == {p2p}))
    peaks = [terms["ranks"][r["pp_rank"]]["peak_in_flight"] for r in ranks]
    rows.append(_row(case, "peak in flight per rank", peaks, [r["peak_in_flight"] for r in ranks],
                     all(r["peak_in_flight"] == p for r, p in zip(ranks, peaks)), "{}"))
    held = activation_peaks(model, lay, "total")
    rows.append(_row(case, "peak layer activation bytes per rank", [held[r["pp_rank"]] for r in ranks],
                     [r["peak_layer_bytes"] for r in ranks],
                     all(r["peak_layer_bytes"] == held[r["pp_rank"]] for r in ranks)))
    emb = [sum(wire_bytes(op, n, EMBEDDING_GROUP) for op, n in embedding_collectives(model, lay, r["pp_rank"]))
           for r in ranks]
    rows.append(_row(case, "embedding all-reduce wire bytes", emb, [r["embedding_wire"] for r in ranks],
                     all(r["embedding_wire"] == e for r, e in zip(ranks, emb))))
    return rows
