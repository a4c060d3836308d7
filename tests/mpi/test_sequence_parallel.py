"""Sequence parallelism (Megatron-SP): the operators f̄/ḡ against their definitions, and the SP GPT against serial.

Story: the three operators do what their definitions say along axis 1 of [b, s, h], forward and backward, and
each backward is the adjoint of its forward. Then the GPT with SP, built from the same seed as the serial GPT,
gives the same loss and every gradient (dropout included, with the exact RNG), also under DP × TP training;
its trace is the plain TP trace with every all-reduce of [b, s, h] split into a reduce-scatter and an
all-gather of the same logical size, plus the LayerNorm gradient all-reduces; the LayerNorm/dropout caches
shrink by tp; and its export equals the plain TP model's.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pytest

from _util import assert_close, randn
from test_data_parallel import assert_matches_serial  # every shard vs the serial tensor, relative to its size
from tpsim.errors import ConfigError
from tpsim.demo.cli import parse
from tpsim.models.build import build_gpt, parallel_gpt, serial_gpt
from tpsim.arch.gpt2 import GPTConfig
from tpsim.nn.dropout import DropoutPlan
from tpsim.tp.random import ExactDropoutRNG
from tpsim.tp.sequence_parallel import (SEQ_AXIS, GatherFromSequenceParallelRegion,
                                        ReduceScatterToSequenceParallelRegion, ScatterToSequenceParallelRegion)
from tpsim.train import AdamW, GradSync, check_replicas, dp_slice, train_step
from tpsim.hf.checkpoint import export_step0

TOL = 1e-10
B, CHUNK, H = 3, 5, 7  # awkward sizes: each rank holds 5 positions of a 5·tp sequence


# --- the operators -----------------------------------------------------------------------------------------------
def per_rank(seed, p, shape):
    """What every rank r holds (the same arrays on every rank, so each can compute the expected answer)."""
    return [randn(seed + r, *shape) for r in range(p)]


def inner_over_ranks(group, a, b):
    """Σ_ranks ⟨a_r, b_r⟩ (the adjoint identity sums over what every rank holds)."""
    with group.tracer.paused():
        return float(group.all_reduce(np.array([np.vdot(a, b)]))[0])


def test_operators_match_their_definitions_along_axis_1(grid):
    g, p, r = grid.tp_group, grid.tp, grid.tp_rank
    s = CHUNK * p
    mine = slice(r * CHUNK, (r + 1) * CHUNK)
    shards = per_rank(10, p, (B, CHUNK, H))  # [b, s/p, h] on rank r
    fulls = per_rank(20, p, (B, s, H))  # a [b, s, h] per rank (partial sums, or upstream gradients)

    # scatter: keep my positions; backward all-gathers them in rank order
    x = randn(30, B, s, H)  # replicated
    assert_close(ScatterToSequenceParallelRegion.forward(x, g), x[:, mine], 0, "scatter forward")
    dx = ScatterToSequenceParallelRegion.backward(shards[r], g)
    assert_close(dx, np.concatenate(shards, axis=SEQ_AXIS), 0, "scatter backward")
    assert abs(inner_over_ranks(g, x[:, mine], shards[r]) - np.vdot(x, dx)) <= 1e-9  # the adjoint identity

    # f̄ (gather): all-gather forward, reduce-scatter backward
    y = GatherFromSequenceParallelRegion.forward(shards[r], g)
    assert_close(y, np.concatenate(shards, axis=SEQ_AXIS), 0, "f̄ forward")
    dshard = GatherFromSequenceParallelRegion.backward(fulls[r], g)
    assert_close(dshard, sum(fulls)[:, mine], TOL, "f̄ backward")
    assert abs(inner_over_ranks(g, y, fulls[r]) - inner_over_ranks(g, shards[r], dshard)) <= 1e-9

    # ḡ (reduce-scatter): sum the partials and keep my positions; backward all-gathers
    z = ReduceScatterToSequenceParallelRegion.forward(fulls[r], g)
    assert_close(z, sum(fulls)[:, mine], TOL, "ḡ forward")
    dfull = ReduceScatterToSequenceParallelRegion.backward(shards[r], g)
    assert_close(dfull, np.concatenate(shards, axis=SEQ_AXIS), 0, "ḡ backward")
    assert abs(inner_over_ranks(g, z, shards[r]) - inner_over_ranks(g, fulls[r], dfull)) <= 1e-9

    got = [(e.phase, e.op, e.shape) for e in grid.tracer.events]
    full, n = (B, s, H), B * s * H * 8
    assert got == [("backward", "all_gather", full), ("forward", "all_gather", full),
                   ("backward", "reduce_scatter", full), ("forward", "reduce_scatter", full),
                   ("backward", "all_gather", full)]
    assert all(e.bytes == n for e in grid.tracer.events), "bytes = the full logical [b, s, h] tensor"


def test_uneven_sequence_is_a_config_error(grid):
    if grid.tp == 1:
        pytest.skip("every length divides by 1")
    x = np.zeros((2, grid.tp + 1, 3))
    for op in (ScatterToSequenceParallelRegion, ReduceScatterToSequenceParallelRegion):
        with pytest.raises(ConfigError, match=f"sequence length {grid.tp + 1} is not divisible by tp {grid.tp}"):
            op.forward(x, grid.tp_group)
    assert not grid.tracer.events, "raised before any collective"


# --- the GPT with SP against serial ------------------------------------------------------------------------------
def config(tp, vocab=None, dropout=0.0, seq=None):
    return GPTConfig(vocab_size=vocab or 16 * tp + 3, n_positions=seq or 3 * tp, n_embd=8 * tp, n_layer=2,
                     n_head=2 * tp, dropout=dropout)


def data(cfg, b=3, seed=1):
    rng = np.random.default_rng(seed)
    s = cfg.n_positions
    return rng.integers(0, cfg.vocab_size, (b, s)), rng.integers(0, cfg.vocab_size, (b, s))


@pytest.mark.parametrize("vocab, dropout", [(None, 0.0), (13, 0.2)], ids=["vocab16p+3", "vocab13-dropout"])
def test_sp_gpt_equals_serial(grid, vocab, dropout):
    cfg = config(grid.tp, vocab, dropout)
    serial = serial_gpt(cfg, seed=4)
    par = parallel_gpt(serial_gpt(cfg, seed=4), grid.tp_group, sequence_parallel=True)
    ids, labels = data(cfg)
    plan = DropoutPlan(ExactDropoutRNG(77), step=3) if dropout else DropoutPlan()
    loss_s = serial.loss_and_grads(ids, labels, plan)
    loss_p = par.loss_and_grads(ids, labels, plan)
    assert abs(loss_p - loss_s) <= TOL * abs(loss_s), f"loss {loss_p!r} vs serial {loss_s!r}"
    assert [n for n, _ in par.named_parameters()] == [n for n, _ in serial.named_parameters()]
    assert_matches_serial(par, serial, "grads")
    if dropout:
        assert loss_s != serial.forward(ids, labels)[0], "dropout did nothing"


def test_sp_dp_tp_training_with_dropout_equals_serial(grid):
    """Every dp × tp layout of the world, SP on, two AdamW steps with dropout: losses, grads, params, replicas."""
    batch, seq = 8, 8  # divisible by every dp and tp up to 8
    cfg = GPTConfig(vocab_size=13, n_positions=seq, n_embd=16, n_layer=2, n_head=8, dropout=0.1)
    rng = np.random.default_rng(5)
    ids, labels = rng.integers(0, 13, (batch, seq)), rng.integers(0, 13, (batch, seq))
    drop = ExactDropoutRNG(11)
    serial = serial_gpt(cfg, seed=3)
    opt_s = AdamW(serial, lr=1e-2)
    par = build_gpt(cfg, grid.tp_group, seed=3, sequence_parallel=True)
    sync, opt_p = GradSync(par, grid.dp_group, bucket_cap_bytes=4096), AdamW(par, lr=1e-2)
    rows = np.arange(batch)[dp_slice(batch, grid.dp, grid.dp_rank)]
    for step in range(2):
        loss_s = serial.loss_and_grads(ids, labels, DropoutPlan(drop, step))
        result = train_step(par, opt_p, grid, sync, ids[rows], labels[rows],
                            plan=DropoutPlan(drop, step, batch_index=rows))
        assert abs(result.loss - loss_s) <= TOL * abs(loss_s), f"step {step}: {result.loss!r} vs {loss_s!r}"
        assert_matches_serial(par, serial, "grads")
        opt_s.step()
    assert_matches_serial(par, serial, "params")
    report = check_replicas(par, grid)  # the LayerNorm grad all-reduce keeps replicated params equal over TP
    assert report.ok, report.summary()


# --- the trace -----------------------------------------------------------------------------------------------
def test_sp_trace_splits_each_all_reduce_into_reduce_scatter_and_all_gather(grid):
    cfg = config(grid.tp)
    ids, labels = data(cfg)
    b, s, h = ids.shape + (cfg.n_embd,)
    plain = parallel_gpt(serial_gpt(cfg, seed=4), grid.tp_group)
    plain.loss_and_grads(ids, labels)
    tp_events = list(grid.tracer.events)
    grid.tracer.reset()
    parallel_gpt(serial_gpt(cfg, seed=4), grid.tp_group, sequence_parallel=True).loss_and_grads(ids, labels)
    sp_events = list(grid.tracer.events)

    act = (b, s, h)  # every activation collective: the full logical [b, s, h]
    expected = [("transformer.wte", "forward", "all_reduce", act)]
    for i in range(cfg.n_layer):
        blk = f"transformer.h.{i}"
        expected += [(f"{blk}.attn.c_attn", "forward", "all_gather", act),  # f̄
                     (f"{blk}.attn.c_proj", "forward", "reduce_scatter", act),  # ḡ
                     (f"{blk}.mlp.c_fc", "forward", "all_gather", act),
                     (f"{blk}.mlp.c_proj", "forward", "reduce_scatter", act)]
    expected += [("lm_head", "forward", "all_gather", act)]
    expected += [("loss", "forward", "all_reduce", (b * s,))] * 3
    expected += [("lm_head", "backward", "all_gather", act), ("lm_head", "backward", "reduce_scatter", act),
                 ("transformer.ln_f", "sp_grad_sync", "all_reduce", (2, h))]
    for i in reversed(range(cfg.n_layer)):
        blk = f"transformer.h.{i}"
        for half, col, row in (("mlp", "c_fc", "ln_2"), ("attn", "c_attn", "ln_1")):
            expected += [(f"{blk}.{half}.c_proj", "backward", "all_gather", act),  # ḡ backward
                         (f"{blk}.{half}.{col}", "backward", "all_gather", act),  # the stored shard, gathered again
                         (f"{blk}.{half}.{col}", "backward", "reduce_scatter", act),  # f̄ backward
                         (f"{blk}.{row}", "sp_grad_sync", "all_reduce", (2, h))]
    expected += [("transformer.wte", "backward", "all_gather", act)]
    assert [(e.scope, e.phase, e.op, e.shape) for e in sp_events] == expected

    # per block and phase: the SP pair moves what TP's all-reduce moved, in logical bytes each and on the wire
    def block(events, i, phase, ops):
        return [e for e in events if e.scope.startswith(f"transformer.h.{i}.") and e.phase == phase and e.op in ops]

    for i in range(cfg.n_layer):
        ar = block(tp_events, i, "forward", ("all_reduce",)) + block(tp_events, i, "backward", ("all_reduce",))
        assert len(ar) == 4 and {e.bytes for e in ar} == {b * s * h * 8}
        fwd = block(sp_events, i, "forward", ("all_gather", "reduce_scatter"))
        assert len(fwd) == 4 and {e.bytes for e in fwd} == {b * s * h * 8}
        assert sum(e.wire_bytes for e in fwd) == sum(e.wire_bytes for e in ar[:2])
        # backward without the two re-gathers of stored shards: one all-gather + one reduce-scatter per half
        bwd = [e for e in block(sp_events, i, "backward", ("all_gather", "reduce_scatter"))
               if not (e.op == "all_gather" and e.scope.endswith(("c_attn", "c_fc")))]
        assert len(bwd) == 4 and sum(e.wire_bytes for e in bwd) == sum(e.wire_bytes for e in ar[2:])


# --- memory -------------------------------------------------------------------------------------------------------
def nbytes(tree, seen=None) -> int:
    """Bytes of every distinct array in a cache (nested tuples/lists), each counted once."""
    seen = set() if seen is None else seen
    if isinstance(tree, np.ndarray):
        if id(tree) in seen:
            return 0
        seen.add(id(tree))
        return tree.nbytes
    if isinstance(tree, (tuple, list)):
        parameters = getattr(type(tree), "PARAMETERS", ())  # a weight a cache points at is no activation
        return sum(nbytes(t, seen) for name, t in zip(getattr(tree, "_fields", [None] * len(tree)), tree)
                   if name not in parameters)
    return 0


def ln_dropout_bytes(cache) -> int:
    """The LayerNorm (x̂, rstd) and dropout-mask caches of the embedding, every block and ln_f."""
    c_tr = cache.transformer
    total = nbytes(c_tr.drop) + nbytes(c_tr.ln_f)
    for blk in c_tr.h:
        total += nbytes(blk.ln_1) + nbytes(blk.attn_dropout) + nbytes(blk.ln_2) + nbytes(blk.mlp_dropout)
    return total


def test_sp_divides_layernorm_and_dropout_activation_memory_by_tp(grid):
    cfg = config(grid.tp, dropout=0.2)
    ids, labels = data(cfg)
    plan = DropoutPlan(ExactDropoutRNG(1), 0)
    with grid.tracer.paused():
        _, plain = parallel_gpt(serial_gpt(cfg, 4), grid.tp_group).forward(ids, labels, plan)
        _, sp = parallel_gpt(serial_gpt(cfg, 4), grid.tp_group, sequence_parallel=True).forward(ids, labels, plan)
    assert ln_dropout_bytes(sp) * grid.tp == ln_dropout_bytes(plain) > 0
    if grid.tp > 1:  # and the whole forward cache shrinks too (the linears keep the [b, s/tp, h] shard)
        assert nbytes(sp) < nbytes(plain), f"SP caches {nbytes(sp)} bytes, plain TP {nbytes(plain)}"


# --- errors and export ----------------------------------------------------------------------------------------
def test_seq_len_not_divisible_by_tp_fails_on_every_rank_before_any_collective(grid):
    if grid.tp == 1:
        pytest.skip("every length divides by 1")
    seq = 3 * grid.tp + 1
    cfg = config(grid.tp, seq=seq)
    par = parallel_gpt(serial_gpt(cfg, 4), grid.tp_group, sequence_parallel=True)
    ids, labels = data(cfg)
    with pytest.raises(ConfigError, match=rf"sequence length {seq} is not divisible by tp {grid.tp} "
                                          r"\(sequence parallelism splits the sequence\)"):
        par.forward(ids, labels)
    assert not grid.tracer.events
    # the demo checks its flags before it builds the grid, and names the flag
    flags = ["--sequence-parallel", "--seq-len", str(seq), "--tp", str(grid.tp), "--vocab", "13",
             "--hidden", str(8 * grid.tp), "--layers", "1", "--heads", str(2 * grid.tp), "--dropout", "0"]
    with pytest.raises(ConfigError, match=f"--seq-len {seq} is not divisible by tp {grid.tp} "):
        parse(flags)


def test_export_of_sp_model_equals_export_of_tp_model(grid):
    """Every rank writes its own export (a private folder) of a plain TP and an SP model with the same weights."""
    cfg = config(grid.tp, vocab=13)
    ids, labels = data(cfg)
    exported = []
    with tempfile.TemporaryDirectory(prefix="tpsim-sp-") as tmp:
        for sp in (False, True):
            model = build_gpt(cfg, grid.tp_group, seed=8, sequence_parallel=sp)
            loss = model.loss_and_grads(ids, labels)
            out = Path(tmp) / f"sp{sp}"
            export_step0(out, model, grid.tp_group, config=cfg, input_ids=ids, labels=labels, loss=loss, write=True)
            with np.load(out / "params.npz") as params, np.load(out / "grads.npz") as grads:
                exported.append(({k: params[k] for k in params.files}, {k: grads[k] for k in grads.files}))
    (p_tp, g_tp), (p_sp, g_sp) = exported
    assert list(p_sp) == list(p_tp) == list(cfg.param_shapes())
    for name in p_tp:
        assert np.array_equal(p_sp[name], p_tp[name]), f"params {name} differ"
        assert_close(g_sp[name], g_tp[name], TOL, f"grads {name}")
