"""The pipeline cases' comparison itself (``tpsim.plan.validate_pipeline``), without MPI: ranks that report the
planner's own numbers match on every term; one rank off by a byte, a micro-batch or a step time beyond 1e-12
relative is a NO on that term alone; a layout the live ranks cannot run is skipped with the config's reason."""

from __future__ import annotations

import pytest

from tpsim.cost import wire_bytes
from tpsim.plan.comm import EMBEDDING_GROUP, embedding_collectives
from tpsim.plan.dp_overlap import specs
from tpsim.gpus import gpu
from tpsim.plan.memory import activation_peaks
from tpsim.plan.of_run import model_spec, run_layout
from tpsim.plan.pipeline import pipeline_terms
from tpsim.plan.validate_pipeline import PIPELINE_CASES, PipelineCase, check_pipeline_case, skipped

LIVE = [c for c in PIPELINE_CASES if skipped(c) is None]


def planned_ranks(case) -> list[dict]:
    """What every rank of ``case`` reports when it measures exactly what the planner predicts."""
    run = case.run()
    model, lay = model_spec(run.model), run_layout(run)
    buckets = specs(model, lay, None) if case.dp > 1 else None  # one bucket a rank, as a live run could cut them
    terms = pipeline_terms(model, lay, gpu(lay.gpu), buckets)
    per_rank = terms["p2p_bytes"]["measured"] // max(1, terms["messages"])  # pp 1 sends nothing
    held = activation_peaks(model, lay, "total")
    out = []
    for dp in range(case.dp):
        for tp in range(case.tp):
            for r in range(case.pp):
                emb = sum(wire_bytes(op, n, EMBEDDING_GROUP) for op, n in embedding_collectives(model, lay, r))
                tp_s = lay.microbatches * sum(s[f"{op}_collectives_s"] for s in terms["stages"] if s["rank"] == r
                                              for op in "FBW")
                out.append({"pp_rank": r, "dp_rank": dp, "tp_rank": tp, "schedule_end": terms["makespan_s"],
                            "clock_end": terms["after_schedule"]["ends"][r],
                            "peak_in_flight": terms["ranks"][r]["peak_in_flight"], "peak_layer_bytes": held[r],
                            "p2p_sent": terms["ranks"][r]["sends"] * per_rank, "embedding_wire": emb,
                            "clock_collectives": tp_s})
                if buckets is not None:  # what a rank with a DP sync reports: its buckets and its exposed wait
                    streams = terms["after_schedule"].get("dp_streams")  # none under ZeRO-3: all in the actions
                    out[-1].update(buckets=[list(b) for b in buckets[r]], clock_busy=terms["ranks"][r]["busy_s"],
                                   dp_exposed=streams[r]["exposed_s"] if streams else 0.0,
                                   sharded_exposed=terms["ranks"][r]["zero3_s"])
                if "param_gather" in terms["after_schedule"]:  # ZeRO-1: the all-gather's exposed part
                    out[-1]["gather_exposed"] = terms["after_schedule"]["param_gather"][r]["exposed_s"]
    return out


@pytest.mark.parametrize("case", LIVE, ids=lambda c: c.name)
def test_the_planners_own_numbers_match_and_any_difference_is_a_no(case):
    ranks = planned_ranks(case)
    assert all(ok for *_, ok in check_pipeline_case(case, ranks))
    for key, nudge, term in (("p2p_sent", 1, "p2p bytes per replica"), ("peak_in_flight", 1, "peak in flight"),
                             ("peak_layer_bytes", 8, "peak layer activation bytes"),
                             ("embedding_wire", 8, "embedding all-reduce"),
                             ("schedule_end", ranks[-1]["schedule_end"] * 1e-11, "virtual makespan"),
                             ("clock_end", ranks[-1]["clock_end"] * 1e-11, "virtual step time"),
                             ("clock_collectives", max(r["clock_collectives"] for r in ranks) * 1e-11 or 1e-9,
                              "TP collectives on"),  # 0 s at tp 1: a nudge of a nanosecond
                             *([("dp_exposed", ranks[-1]["clock_end"] * 1e-11, "exposed DP seconds")]
                               if "dp_exposed" in ranks[0] else []),
                             *([("gather_exposed", ranks[-1]["clock_end"] * 1e-11, "exposed param all-gather")]
                               if "gather_exposed" in ranks[0] else []),
                             *([("sharded_exposed", ranks[-1]["clock_end"] * 1e-11, "exposed ZeRO-3 collectives")]
                               if case.zero == 3 else [])):
        bad = [dict(r) for r in ranks]
        latest = max(range(len(bad)), key=lambda i: bad[i][key])  # a clock compared as its pipeline's latest
        bad[latest][key] += nudge
        rows = check_pipeline_case(case, bad)
        follows = "bubble" if key == "schedule_end" else None  # a later schedule end may idle more, if visibly
        assert [t for _, t, _, _, ok in rows if not ok and not (follows and t.startswith(follows))] == \
            [next(t for _, t, *_ in rows if t.startswith(term))]


def test_every_schedule_runs_live_and_a_layout_the_config_refuses_is_skipped_with_its_reason():
    assert {c.schedule for c in LIVE} == {"1f1b", "interleaved", "afab", "zb-h1"} and all(c.ranks == 4 for c in LIVE)
    assert {(c.pp, c.zero, c.overlap) for c in LIVE if c.overlap} == {(1, 0, "grad"), (2, 0, "grad"), (2, 1, "both")}
    assert any(c.sp for c in LIVE) and any(c.arch == "llama" and c.tp > 1 for c in LIVE)
    assert any(c.tp_comm_overlap and c.sp and c.tp > 1 for c in LIVE)
    refused = PipelineCase("PP 4, interleaved vp 2, m 6", 1, 1, 4, "interleaved", vp=2, microbatches=6, layers=8)
    assert "must be a multiple of --pp 4" in skipped(refused)
