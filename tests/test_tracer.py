"""The tracer's compute spans, one process: they nest, cost nothing when off, and the GPT wiring opens them."""

from __future__ import annotations

import time

import numpy as np
import pytest

from tpsim.comm.tracer import SpanEvent, Tracer
from tpsim.models.build import serial_gpt
from tpsim.arch.gpt2 import GPTConfig
from tpsim.models.gpt import attach_tracer


def end(s: SpanEvent) -> float:
    return s.start + s.duration


def parent_scope(scope: str) -> str:
    """``transformer.h.0.ln_1`` → ``transformer.h.0`` → ``transformer`` → ``""`` (the model)."""
    parts = scope.split(".")
    if parts[-1].isdigit():  # a list entry (h.0) is one module
        parts = parts[:-1]
    return ".".join(parts[:-1])


def contains(outer: SpanEvent, inner: SpanEvent) -> bool:
    return outer.start <= inner.start and end(inner) <= end(outer)


def test_span_records_scope_phase_step_and_time():
    tr = Tracer(rank=3)
    tr.step = 7
    with tr.span("transformer.h.0.mlp", "forward"):
        time.sleep(0.002)
    (s,) = tr.spans
    assert (s.rank, s.step, s.phase, s.scope) == (3, 7, "forward", "transformer.h.0.mlp")
    assert s.start >= 0 and 0.002 <= s.duration < 1.0
    assert s.as_dict() == {"rank": 3, "step": 7, "phase": "forward", "scope": "transformer.h.0.mlp",
                           "start": s.start, "duration": s.duration, "kind": "layer"}


def test_spans_nest_and_siblings_do_not_overlap():
    tr = Tracer()
    with tr.span("block", "forward"):
        with tr.span("block.attn", "forward"):
            with tr.span("block.attn.c_proj", "forward"):
                pass
        with tr.span("block.mlp", "forward"):
            pass
    by = {s.scope: s for s in tr.spans}
    assert [s.scope for s in tr.spans] == ["block.attn.c_proj", "block.attn", "block.mlp", "block"], \
        "a span is appended when it ends: children before their parent"
    assert contains(by["block"], by["block.attn"]) and contains(by["block.attn"], by["block.attn.c_proj"])
    assert contains(by["block"], by["block.mlp"])
    assert end(by["block.attn"]) <= by["block.mlp"].start, "siblings follow one another"


def test_span_only_times_it_does_not_retag_collectives():
    tr = Tracer()
    with tr.region(scope="outer", phase="backward"):
        with tr.span("transformer.h.0", "forward"):
            assert (tr.scope, tr.phase) == ("outer", "backward")


def test_span_is_recorded_when_the_block_raises():
    tr = Tracer()
    with pytest.raises(RuntimeError):
        with tr.span("x", "forward"):
            raise RuntimeError("boom")
    assert [s.scope for s in tr.spans] == ["x"]


def test_disabled_and_paused_tracers_record_no_spans():
    tr = Tracer(enabled=False)
    assert tr.span("a", "forward") is tr.span("b", "backward"), "one shared no-op context, nothing allocated"
    with tr.span("a", "forward"):
        pass
    on = Tracer()
    with on.paused(), on.span("a", "forward"):
        pass
    assert tr.spans == [] and on.spans == []


def test_reset_clears_spans_and_events():
    tr = Tracer()
    with tr.span("a", "forward"):
        tr.record(op="barrier", reduce_op="", group="world", group_size=1, group_ranks=(0,), dtype="uint8",
                  shape=(0,), bytes=0, wire_bytes=0, start=0.0, duration=0.0)
    assert len(tr.spans) == len(tr.events) == 1
    tr.reset()
    assert tr.spans == [] and tr.events == []


def small_gpt():
    cfg = GPTConfig(vocab_size=11, n_positions=8, n_embd=16, n_layer=2, n_head=2)
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 11, size=(2, 8))
    return serial_gpt(cfg, seed=1), ids, np.roll(ids, -1, axis=1)


def test_serial_gpt_without_tracer_is_untouched():
    model, ids, labels = small_gpt()
    assert model.tracer is None and model.transformer.h[0].tracer is None
    loss = model.loss_and_grads(ids, labels)
    assert np.isfinite(loss)


def test_gpt_wiring_opens_one_span_per_sub_layer_call_nested_like_the_module_tree():
    model, ids, labels = small_gpt()
    plain = serial_gpt(model.config, seed=1).loss_and_grads(ids, labels)
    tr = Tracer()
    attach_tracer(model, tr)
    tr.step = 4
    assert model.loss_and_grads(ids, labels) == plain, "timing changes nothing"
    layers = [s for s in tr.spans if s.kind == "layer"]  # the marks inside them: tests/test_kinds.py
    for phase in ("forward", "backward"):
        spans = {s.scope: s for s in layers if s.phase == phase}
        block = ["transformer.h.0", "transformer.h.1"]
        expected = {"", "transformer", "transformer.wte", "transformer.wpe", "transformer.ln_f", "lm_head", "loss",
                    *block, *(f"{b}.{c}" for b in block for c in ("ln_1", "attn", "ln_2", "mlp"))}
        assert set(spans) == expected, phase
        assert sum(s.phase == phase for s in layers) == len(expected), "each sub-layer timed once"
        for scope, s in spans.items():
            if scope:  # every span sits inside its parent module's span; the model's ("") holds them all
                parent = parent_scope(scope)
                assert contains(spans[parent], s), f"{phase}: {scope} is not inside {parent or 'the model'}"
        assert all(s.step == 4 for s in tr.spans)
    fwd_end = max(end(s) for s in tr.spans if s.phase == "forward")
    assert fwd_end <= min(s.start for s in tr.spans if s.phase == "backward")
