"""The DP comm stream's cost rule (``tpsim.pipeline.overlap``) by hand, and the planner pricing it
(``tpsim.plan.dp_overlap`` through ``pipeline_terms``): buckets ready at their piece's end, run in issue order,
the wait before the optimizer exposed; without the overlap, every second exposed. No MPI."""

from __future__ import annotations

import pytest

from tpsim.pipeline.overlap import (EMBEDDING, HEAD, BucketSpec, after_compute, backward_pieces, comm_stream,
                                    forward_gates, forward_pieces, gated_ends, layer, piece_ends, piece_of,
                                    playbook_hides)
from tpsim.pipeline.stage_clock import ROUNDING
from tpsim.partition import assign_buckets
from tpsim.plan.comm import dp_collectives
from tpsim.plan.dp_overlap import piece_costs, rank_entries, specs, stage_buckets, stage_ranges
from tpsim.plan.layout import rank_layers
from tpsim.plan.memory import STATE_BYTES, stage_param_elements
from tpsim.gpus import gpu
from tpsim.plan.layout import Layout
from tpsim.plan.models import resolve as model_named
from tpsim.plan.param_gather import gather_bytes
from tpsim.plan.pipeline import head_seconds, layer_seconds, pipeline_terms
from tpsim.plan.pipeline_comm import loss_normalizer_s
from time_invariants import stream_problems


def test_the_stream_runs_buckets_in_issue_order_from_their_ready_time_and_the_wait_is_exposed():
    # ready 1, 2, 2.5 taking 1.5, 1, 0.5; compute ends at 3:
    # b0 1 -> 2.5; b1 waits for the stream: 2.5 -> 3.5; b2 3.5 -> 4; the optimizer waits 4 - 3 = 1
    s = comm_stream([0, 1, 2], [1.0, 2.0, 2.5], [1.5, 1.0, 0.5], 3.0)
    assert [(b.bucket, b.start, b.end) for b in s.spans] == [(0, 1.0, 2.5), (1, 2.5, 3.5), (2, 3.5, 4.0)]
    assert (s.end, s.exposed, s.comm, s.hidden, s.after_first_ready) == (4.0, 1.0, 3.0, 2.0, 2.0)
    # issued the other way round: b1 2 -> 3, b0 3 -> 4.5, b2 4.5 -> 5
    s = comm_stream([1, 0, 2], [1.0, 2.0, 2.5], [1.5, 1.0, 0.5], 3.0)
    assert [(b.bucket, b.start, b.end) for b in s.spans] == [(1, 2.0, 3.0), (0, 3.0, 4.5), (2, 4.5, 5.0)]
    assert s.exposed == 2.0 and not stream_problems(s)
    # the stream idle between two buckets: b1 is ready at 4, after b0 ended at 2; it starts at 4, not at 2
    s = comm_stream([0, 1], [1.0, 4.0], [1.0, 1.0], 3.0)
    assert [(b.bucket, b.start, b.end) for b in s.spans] == [(0, 1.0, 2.0), (1, 4.0, 5.0)]
    assert (s.exposed, s.hidden) == (2.0, 0.0) and not stream_problems(s)


def test_a_stream_that_ends_before_the_compute_is_hidden_and_without_overlap_all_of_it_shows():
    s = comm_stream([0], [0.5], [1.0], 2.0)
    assert (s.end, s.exposed, s.hidden) == (2.0, 0.0, 1.0)
    plain = after_compute(2, [1.0, 2.0], 5.0)
    assert [(b.start, b.end) for b in plain.spans] == [(5.0, 6.0), (6.0, 8.0)]
    assert (plain.end, plain.exposed, plain.hidden) == (8.0, 3.0, 0.0)
    empty = comm_stream([], [], [], 1.5)
    assert (empty.end, empty.exposed, empty.after_first_ready) == (1.5, 0.0, 0.0)


def test_param_gather_gates_the_first_forward_piece_that_reads_a_bucket_and_the_playbook_condition():
    s = comm_stream([0, 1], [0.0, 0.0], [1.0, 2.0], 0.0)  # the all-gathers from the optimizer's end: 0-1, 1-3
    buckets = [BucketSpec(8, 0, HEAD, False, (0, layer(1))), BucketSpec(8, 0, layer(0), False, (0, EMBEDDING))]
    gates = forward_gates(buckets, s)
    assert gates == {(0, layer(1)): 1.0, (0, EMBEDDING): 3.0}
    # the forward from 0.5: the embedding (0 s) waits for bucket 1 until 3, layer 0 (0.5 s) runs, layer 1 (0.25 s)
    # is past its gate at 3.5: ends 3, 3.5, 3.75, waited 2.5
    keys = [(0, EMBEDDING), (0, layer(0)), (0, layer(1))]
    assert gated_ends(0.5, [0.0, 0.5, 0.25], [gates.get(k, 0.0) for k in keys]) == ([3.0, 3.5, 3.75], 2.5)
    assert playbook_hides(3.0, 3.0) and not playbook_hides(2.0, 3.0)


def test_pieces_run_head_layers_last_to_first_embedding_and_end_where_their_seconds_add_up():
    assert backward_pieces(range(2, 4), first=False, last=True) == [HEAD, layer(3), layer(2)]
    assert backward_pieces(range(0, 2), first=True, last=True) == [HEAD, layer(1), layer(0), EMBEDDING]
    assert forward_pieces(range(0, 2), first=True, last=False) == [EMBEDDING, layer(0), layer(1)]
    assert piece_ends(1.0, [0.5, 0.25, 0.0]) == [1.5, 1.75, 1.75]
    embeds = ("transformer.wte", "transformer.wpe")
    assert piece_of("transformer.h.13.mlp.c_fc.weight", "transformer.h", embeds, False) == layer(13)
    assert piece_of("transformer.wte.weight", "transformer.h", embeds, True) == EMBEDDING
    assert piece_of("transformer.wte.weight", "transformer.h", embeds, False) == HEAD  # the tied head's copy
    assert piece_of("transformer.wpe", "transformer.h", embeds, True) == EMBEDDING
    assert piece_of("transformer.ln_f", "transformer.h", embeds, True) == HEAD
    assert piece_of("lm_head", "model.layers", ("model.embed_tokens",), True) == HEAD


LAYOUTS = [Layout(tp=2, dp=4, pp=1, seq_len=1024, micro_batch=1, global_batch=8),
           Layout(tp=2, dp=2, pp=2, seq_len=1024, micro_batch=1, global_batch=16),
           Layout(tp=1, dp=2, pp=2, seq_len=1024, micro_batch=1, global_batch=16, schedule="zb-h1", zero=1)]


def one_bucket_a_rank(m, lay) -> list[list[BucketSpec]]:
    """Each rank's gradients as one bucket, finished by its lowest virtual stage's last backward piece."""
    last, tied, ranges, layers = lay.pp * lay.vp - 1, m.tied and lay.pp > 1, stage_ranges(m, lay), rank_layers(m, lay)
    out = []
    for r in range(lay.pp):
        keys = backward_pieces(ranges[r], r == 0, r == last)
        n = dp_collectives(lay, stage_param_elements(m, lay.tp, lay.pp, r, layers[r]))[0][1]
        out.append([BucketSpec(int(n), r, keys[-1], tied and r in (0, lay.pp - 1), (r, keys[-1]))])
    return out


@pytest.mark.parametrize("lay", LAYOUTS, ids=lambda x: f"pp{x.pp}-dp{x.dp}-{x.schedule}-zero{x.zero}")
def test_the_planner_prices_one_bucket_a_rank_ready_when_its_last_backward_ends(lay):
    """One bucket a rank (``stage_buckets``), finished by the rank's last backward piece: ready when that rank's
    final backward ends on the planner's timeline; on the stream from there; the wait is max(0, ready + t − the
    clock before the DP sync); with the flag off, all of t."""
    m, g = model_named("gpt2-medium"), gpu("h100-80gb")
    one = one_bucket_a_rank(m, lay)
    plain = pipeline_terms(m, lay, g, one)
    over = pipeline_terms(m, Layout(**{**lay.__dict__, "overlap_grad_reduce": True}), g, one)
    for r in range(lay.pp):
        p, o = plain["after_schedule"], over["after_schedule"]
        assert not stream_problems(p["dp_streams"][r]) and not stream_problems(o["dp_streams"][r])
        t = p["dp_s"][r]
        assert p["dp_streams"][r]["exposed_s"] == pytest.approx(t, rel=ROUNDING)
        bucket = o["dp_streams"][r]["buckets"][0]
        tables = {"layer": layer_seconds(m, lay, g), "head": head_seconds(m, lay, g)}
        keys, with_comm, _ = piece_costs(m, over_layout(lay), g, r, "W" if lay.schedule == "zb-h1" else "B", tables)
        assert keys[-1] == one[r][0].piece
        if r == lay.pp - 1:  # the last rank's last action is its final backward; a tied head's bucket waits
            held = one[r][0].held  # for the embedding group's sum (pp > 1)
            finish = over["ranks"][r]["finish_s"]
            assert bucket["ready"] == pytest.approx(max(finish, o["before_dp"][r]) if held else finish, rel=ROUNDING)
            assert held == (lay.pp > 1)
        want = max(0.0, bucket["ready"] + t - o["before_dp"][r])
        assert o["dp_streams"][r]["exposed_s"] == pytest.approx(want, rel=ROUNDING, abs=ROUNDING * over["step_s"])
        assert o["dp_streams"][r]["exposed_s"] <= p["dp_streams"][r]["exposed_s"] * (1 + ROUNDING)
    assert over["step_s"] <= plain["step_s"] * (1 + ROUNDING)


def over_layout(lay):
    return Layout(**{**lay.__dict__, "overlap_grad_reduce": True})


def test_overlap_needs_each_buckets_piece():
    lay = over_layout(LAYOUTS[1])
    with pytest.raises(ValueError, match="needs each bucket's piece"):
        specs(model_named("gpt2-medium"), lay, [[1000, 2000], [3000]])
    given = [[BucketSpec(1000, 0, HEAD, False)], [BucketSpec(2000, 1, HEAD, True)]]
    assert specs(model_named("gpt2-medium"), lay, given) == given


def test_the_planner_waits_for_the_param_gather_at_the_first_forward_piece_or_after_the_dp_sync():
    """ZeRO-1 at pp 1, one bucket: its all-gather (g seconds from the optimizer's end, the step's 0) is first read
    by the embedding, the forward's first piece; the one stage starts after the loss normalizer (n seconds), so
    with the flag it waits max(0, g − n) there and the makespan grows by that; without, all g comes after the DP
    sync. Bytes: the bucket's elements in the parameters' dtype (bfloat16, the default: half its float32 gradients')."""
    m, g = model_named("gpt2-medium"), gpu("h100-80gb")
    base = dict(tp=1, dp=4, pp=1, zero=1, seq_len=1024, micro_batch=1, global_batch=8)
    plain, over = (pipeline_terms(m, Layout(**base, overlap_param_gather=flag), g,
                                  one_bucket_a_rank(m, Layout(**base))) for flag in (False, True))
    p, o = plain["after_schedule"]["param_gather"][0], over["after_schedule"]["param_gather"][0]
    assert p["comm_s"] == o["comm_s"] > 0 and p["exposed_s"] == pytest.approx(p["comm_s"], rel=ROUNDING)
    assert p["end_s"] == pytest.approx(plain["after_schedule"]["dp_streams"][0]["end_s"] + p["comm_s"], rel=ROUNDING)
    n = loss_normalizer_s(Layout(**base), g)
    assert o["exposed_s"] == pytest.approx(max(0.0, o["comm_s"] - n), rel=ROUNDING)
    assert over["makespan_s"] == pytest.approx(plain["makespan_s"] + o["exposed_s"], rel=ROUNDING)
    assert gather_bytes(Layout(**base, dtype="float32"), 800) == 800 and gather_bytes(Layout(**base), 800) == 400


@pytest.mark.parametrize("lay", LAYOUTS + [Layout(tp=2, dp=2, pp=2, seq_len=1024, global_batch=16,
                                                  schedule="interleaved", vp=2)],
                         ids=lambda x: f"pp{x.pp}-dp{x.dp}-{x.schedule}-vp{x.vp}")
def test_the_planner_alone_cuts_real_buckets_as_grad_sync_does_and_overlap_hides_part_of_them(lay):
    """No live run: each rank's gradients in GradSync's packing order (head, layers last to first, embedding; the
    chunks last to first), cut by assign_buckets at --bucket-mb; the bytes add up to the stage's gradients; each
    bucket finished by its last entry's piece; the tied embedding's held (pp > 1); the overlap hides some."""
    m, g = model_named("gpt2-medium"), gpu("h100-80gb")
    lay = Layout(**{**lay.__dict__, "bucket_mb": 4.0})
    grad, cut = STATE_BYTES[lay.dtype][1], stage_buckets(m, lay)
    for r in range(lay.pp):
        entries = rank_entries(m, lay, r)
        assert sum(b.nbytes for b in cut[r]) == grad * stage_param_elements(m, lay.tp, lay.pp, r,
                                                                             rank_layers(m, lay)[r])
        groups = assign_buckets([("", n * grad, "g") for _, _, n in entries], int(4.0 * 2 ** 20))
        assert [b.piece for b in cut[r]] == [entries[grp[-1]][0] for grp in groups]
        assert all(b.nbytes <= 4 * 2 ** 20 or len(grp) == 1 for b, grp in zip(cut[r], groups))
        assert any(b.held for b in cut[r]) == (m.tied and lay.pp > 1 and r in (0, lay.pp - 1))
    assert specs(m, lay, None) == cut
    plain = pipeline_terms(m, lay, g)
    over = pipeline_terms(m, Layout(**{**lay.__dict__, "overlap_grad_reduce": True}), g)
    for r in range(lay.pp):
        p, o = plain["after_schedule"]["dp_streams"][r], over["after_schedule"]["dp_streams"][r]
        assert not stream_problems(p, f"rank {r}") and not stream_problems(o, f"rank {r} overlapped")
        assert len(p["buckets"]) == len(cut[r]) > 1 and p["exposed_s"] == pytest.approx(p["comm_s"], rel=ROUNDING)
        assert o["comm_s"] == pytest.approx(p["comm_s"], rel=ROUNDING) and o["exposed_s"] < p["exposed_s"]
