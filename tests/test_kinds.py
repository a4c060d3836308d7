"""Where the time goes: the kinds of compute (``tpsim.kinds``), recorded by the tracer, split per layer by
``tpsim.trace.kind_split`` (issue 12, item 2). Serial and MPI-free: the wiring's tracer is a plain Tracer.

The story: marks record nothing until a span is open; inside one they become spans of their kind, tagged with
the span's scope; the split of a layer adds up to its span exactly, and for an MLP big enough to measure
nearly all of it is marked work. Communication: the rank that spent least time in a collective arrived last,
so the others' surplus is waiting.
"""

from __future__ import annotations

import numpy as np
import pytest

from tpsim import kinds
from tpsim.comm.tracer import Tracer
from tpsim.models.build import serial_gpt
from tpsim.arch.gpt2 import GPTConfig
from tpsim.models.gpt import attach_tracer
from tpsim.nn import MLP
from tpsim.trace.kind_split import COLUMNS, comm_waits, format_kind_table, kind_split
from tpsim.trace.records import with_microseconds
from tpsim.trace.schema import SPAN_FIELDS, field_problems
from tpsim.trace.timeline import chrome_trace


def test_marks_record_nothing_without_a_span_and_the_recorder_is_restored():
    tr = Tracer()
    with kinds.MATMUL_MARK:
        pass
    assert tr.span_events() == [] and kinds._recorder is None
    with tr.span("mlp", "forward"):
        assert kinds._recorder is not None
        with kinds.MATMUL_MARK:
            with kinds.MATMUL_MARK:  # re-entrant: the inner one does not lose the outer's start
                pass
    assert kinds._recorder is None, "the span puts back what it found"
    spans = tr.span_events()
    assert [(s.kind, s.scope) for s in spans] == [("layer", "mlp")] + [("matmul", "mlp")] * 2
    inner, outer = spans[1], spans[2]  # recorded as they end: the inner mark first
    assert outer.start <= inner.start and outer.duration >= inner.duration
    assert spans[0].start <= outer.start and tr.spans == spans[:1], "marks are kept apart from the layer spans"


def test_disabled_or_paused_tracers_record_no_marks():
    for tr in (Tracer(enabled=False), Tracer()):
        with tr.span("x", "forward"), tr.paused(), kinds.ELEMENTWISE_MARK:
            pass
        assert tr.marks == [] and all(s.kind == "layer" for s in tr.span_events()), tr.marks


def test_marked_function_is_the_same_function_timed():
    @kinds.marked(kinds.SOFTMAX_NORM)
    def double(x):
        """doc"""
        return 2 * x

    tr = Tracer()
    assert double(3) == 6 and double.__doc__ == "doc" and tr.span_events() == []
    with tr.span("ln", "backward"):
        assert double(4) == 8
    assert [(s.kind, s.phase) for s in tr.span_events()] == [("layer", "backward"), ("softmax_norm", "backward")]


def small_gpt():
    cfg = GPTConfig(vocab_size=11, n_positions=8, n_embd=16, n_layer=1, n_head=2)
    ids = np.random.default_rng(0).integers(0, 11, size=(2, 8))
    return serial_gpt(cfg, seed=1), ids, np.roll(ids, -1, axis=1)


def test_the_gpt_layers_mark_the_kinds_they_are_made_of():
    model, ids, labels = small_gpt()
    tr = Tracer()
    attach_tracer(model, tr)
    model.loss_and_grads(ids, labels)
    got = {}
    for s in tr.span_events():
        got.setdefault((s.scope, s.phase), set()).add(s.kind)
    for phase in ("forward", "backward"):
        assert got[("transformer.h.0.attn", phase)] == {"layer", "matmul", "elementwise", "softmax_norm"}, phase
        assert got[("transformer.h.0.mlp", phase)] == {"layer", "matmul", "elementwise"}, phase
        assert got[("transformer.h.0.ln_1", phase)] == {"layer", "softmax_norm"}, phase
        assert got[("transformer.h.0", phase)] == {"layer", "elementwise"}, "the residual adds"
        assert got[("loss", phase)] == {"layer", "softmax_norm"}, phase
    assert all(field_problems(with_microseconds(s.as_dict()), SPAN_FIELDS) == [] for s in tr.span_events())


def traced_mlp(hidden: int, tokens: int, repeats: int = 1) -> list[dict]:
    mlp = MLP(hidden, rng=np.random.default_rng(0), dtype=np.float32).set_path("mlp")
    x = np.random.default_rng(1).standard_normal((tokens, hidden)).astype(np.float32)
    tr = Tracer()
    for step in range(repeats):
        tr.step = step
        with tr.span("mlp", "forward"):
            z, cache = mlp.forward(x)
        with tr.span("mlp", "backward"):
            mlp.backward(z, cache)
    return [s.as_dict() for s in tr.span_events()]


def test_an_mlps_kinds_add_up_to_its_span_and_cover_nearly_all_of_it():
    spans = traced_mlp(256, 512, repeats=3)
    for step in range(3):
        rows, ranks = kind_split(spans, [], step)
        assert ranks == 1 and list(rows) == ["mlp"]
        row = rows["mlp"]
        span = sum(s["duration"] for s in spans if s["step"] == step and s["kind"] == "layer")
        marked = sum(row.get(k, 0.0) for k in kinds.MARKED)
        assert sum(row.values()) == pytest.approx(span, rel=1e-9), "every second of the span, counted once"
        assert marked <= span
        assert row["matmul"] > row.get("elementwise", 0.0) > 0 and row.get("softmax_norm", 0.0) == 0
        best = max(marked / span for step in range(3)) if step == 2 else None
    assert best >= 0.8, f"matmul + elementwise cover {best:.0%} of the MLP's span: the rest is Python"


def rec(rank, op, start, duration, group="tp", members=(0, 1), step=0, scope="mlp.c_proj"):
    return {"rank": rank, "step": step, "phase": "forward", "scope": scope, "op": op, "reduce_op": "", "group": group,
            "group_size": len(members), "group_ranks": list(members), "dtype": "float32", "shape": [4],
            "bytes": 16, "wire_bytes": 16, "start": start, "duration": duration}


def test_the_last_to_arrive_waited_for_nobody():
    records = [rec(0, "all_reduce", 1.0, 5e-3), rec(1, "all_reduce", 1.003, 2e-3),  # rank 1 arrived last
               rec(0, "all_reduce", 2.0, 1e-3), rec(1, "all_reduce", 2.0, 4e-3),
               rec(0, "broadcast", 3.0, 1e-3), rec(1, "broadcast", 3.0, 4e-3)]  # root may leave early: not split
    assert comm_waits(records) == pytest.approx([3e-3, 0.0, 0.0, 3e-3, 0.0, 0.0])
    assert comm_waits(records[:1] + records[2:3]) == [0.0, 0.0], "a group with one member's records: no split"


def test_split_of_nested_spans_marks_and_collectives_is_exact():
    def span(scope, start, duration, kind="layer"):
        return {"rank": 0, "step": 0, "phase": "forward", "scope": scope, "start": start, "duration": duration,
                "kind": kind}
    spans = [span("h.0", 0.0, 10.0), span("h.0", 0.5, 0.5, "elementwise"), span("h.0.mlp", 1.0, 8.0),
             span("h.0.mlp", 1.5, 3.0, "matmul"), span("h.0.mlp", 5.0, 1.0, "elementwise")]
    records = [rec(0, "all_reduce", 6.5, 2.0, members=(0,), scope="h.0.mlp.c_proj"),
               rec(0, "all_reduce", 11.0, 1.0, members=(0,), scope="ddp.bucket0")]
    rows, _ = kind_split(spans, records, 0)
    assert list(rows) == ["h.0", "h.0.mlp", "ddp"]
    assert rows["h.0"] == pytest.approx({"elementwise": 0.5, "other": 1.5})
    assert rows["h.0.mlp"] == pytest.approx({"matmul": 3.0, "elementwise": 1.0, "comm_wait": 0.0,
                                             "comm_transfer": 2.0, "other": 2.0})
    assert rows["ddp"] == pytest.approx({"comm_wait": 0.0, "comm_transfer": 1.0})
    table = format_kind_table(rows, title="t")
    lines = table.splitlines()
    assert lines[2].split() == ["layer", "matmul", "elementwise", "softmax_norm", "wait", "transfer", "other", "total"]
    assert max(len(line) for line in lines) <= 100
    total = lines[-1].split()
    assert total[0] == "total" and total[-1] == "11000" and total[1:3] == ["3000", "27%"]  # whole ms above 1 s
    small = format_kind_table({"h.0": {"matmul": 0.0123, "other": 0.9}}).splitlines()[-1].split()
    assert small[1:3] == ["12.30", "1%"] and small[-1] == "912.3"  # 0.01 ms below 100 ms, 0.1 ms below 1 s


def test_chrome_trace_names_marks_by_kind_inside_their_layer_and_shows_the_wait():
    spans = traced_mlp(32, 16)
    records = [rec(0, "all_reduce", 1.0, 5e-3), rec(1, "all_reduce", 1.003, 2e-3)]
    events = [e for e in chrome_trace(spans, records)["traceEvents"] if e["ph"] == "X"]
    marks = [e for e in events if e["tid"] == 0 and e["args"]["kind"] != "layer"]
    assert marks and {e["name"] for e in marks} == {"matmul", "elementwise"}
    assert all(e["args"]["scope"] == "mlp" for e in marks)
    waits = [e for e in events if e["name"] == "wait"]
    assert len(waits) == 1 and waits[0]["pid"] == 0 and waits[0]["dur"] == pytest.approx(3000)
    assert [e["args"]["wait_us"] for e in events if e["tid"] == 1 and e["name"] != "wait"] == [3000.0, 0.0]
