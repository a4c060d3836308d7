"""The trace against the paper's formulas: one real training step per TP × DP layout, every row exact.

Story: build the GPT at each layout the world allows (the ``grid`` fixture: at world 8 that is dp × tp =
8×1, 4×2, 2×4, 1×8), run one step exactly as the demo does (the batch broadcast in TP, forward, loss
normaliser, backward, bucketed DDP sync, clipping, AdamW), then put this rank's own records beside
``predict_step`` and require equal calls, bytes and wire bytes for every (layer, phase, op, group). Then memory:
the bytes this rank's live arrays hold against ``predict_memory`` — parameters, gradients, optimizer state and
the forward cache, exactly, with and without dropout, with and without sequence parallelism, on every rank (a
padded vocabulary gives the last ranks fewer real logit columns, so the loss's softmax differs per rank). Under
SP the LayerNorm/dropout region of a block holds exactly 1/tp of what plain TP holds, and the rest is unchanged.
"""

from __future__ import annotations

import numpy as np
import pytest

from tpsim.models.build import build_gpt
from tpsim.arch.gpt2 import GPTConfig
from tpsim.nn.dropout import DropoutPlan
from tpsim.tp.random import ExactDropoutRNG
from tpsim.config import RunConfig
from tpsim.predict.formulas import predict_step
from tpsim.trace.formula_check import compare, format_comparison
from tpsim.predict.gpt_memory import block_activation_elements, block_activation_regions
from tpsim.predict.memory import param_elements, predict_memory
from tpsim.trace.measure import format_memory, measure_activations, measure_memory
from tpsim.train import AdamW, GradSync, apply_update, broadcast_batch, compute_grads, dp_slice

# vocab 13 divides by no tp > 1 (padding); a small bucket cap gives several DDP buckets; label smoothing packs
# the loss's third all-reduce as [2, b·s]; no clipping removes a row.
CASES = {
    "vocab13-buckets-clip": dict(vocab=13, hidden=16, layers=2, seq=5, rows=2, cap=4096, clip=1.0, smoothing=0.0),
    "vocab40-smoothing-noclip": dict(vocab=40, hidden=24, layers=1, seq=6, rows=3, cap=None, clip=None,
                                     smoothing=0.1),
}


def one_step(grid, case, dtype=np.float64, sequence_parallel=False):
    """This rank's records of one training step, the predictions, and the GradSync."""
    cfg = GPTConfig(vocab_size=case["vocab"], n_positions=case["seq"], n_embd=case["hidden"],
                    n_layer=case["layers"], n_head=8)
    sp = {"sequence_parallel": True} if sequence_parallel else {}
    model = build_gpt(cfg, grid.tp_group, seed=2, dtype=dtype, **sp)
    model.loss.label_smoothing = case["smoothing"]
    sync = GradSync(model, grid.dp_group, **({} if case["cap"] is None else {"bucket_cap_bytes": case["cap"]}))
    opt = AdamW(model, lr=1e-3)
    batch = case["rows"] * grid.dp
    rows = dp_slice(batch, grid.dp, grid.dp_rank)
    rng = np.random.default_rng(7)
    ids, labels = rng.integers(0, cfg.vocab_size, (2, batch, case["seq"]))
    grid.tracer.reset()
    grid.tracer.step = 0
    ids, labels = broadcast_batch(grid, ids[rows], labels[rows])  # as the demo: TP rank 0's rows win
    compute_grads(model, grid, sync, ids, labels)
    apply_update(model, opt, grid, case["clip"])
    run = RunConfig.of(cfg, tp=grid.tp, dp=grid.dp, sp=sequence_parallel, batch_size=batch, seq_len=case["seq"],
                       dtype=dtype)
    predicted = predict_step(run, clip=case["clip"] is not None, ddp_buckets=len(sync.buckets),
                             label_smoothing=bool(case["smoothing"]))
    return [e.as_dict() for e in grid.tracer.events], predicted, sync, cfg


@pytest.mark.parametrize("name", list(CASES))
def test_every_collective_of_a_step_matches_the_formulas(grid, name):
    records, predicted, sync, cfg = one_step(grid, CASES[name])
    rows = compare(records, predicted)
    table = format_comparison(rows, title=f"TP({grid.tp}) x DP({grid.dp}) rank {grid.rank}, {name}:")
    unpredicted = [(r.layer, r.phase, r.op) for r in rows if r.predicted_bytes is None]
    assert not unpredicted, f"measured collectives nobody predicted: {unpredicted}\n{table}"
    bad = [r for r in rows if not (r.match and r.measured_wire == r.predicted_wire)]
    assert not bad, f"{len(bad)} rows differ\n{table}"
    # the DDP bytes came from the config alone (padded vocabulary, tied head once): check them against the sync
    assert sync.total_bytes == param_elements(cfg, grid.tp) * 8


def test_sequence_parallel_step_matches_the_formulas(grid):
    case = dict(CASES["vocab13-buckets-clip"], seq=8)  # the sequence splits over every tp up to 8
    records, predicted, _, _ = one_step(grid, case, sequence_parallel=True)
    rows = compare(records, predicted)
    table = format_comparison(rows, title=f"SP, TP({grid.tp}) x DP({grid.dp}) rank {grid.rank}:")
    unpredicted = [(r.layer, r.phase, r.op) for r in rows if r.predicted_bytes is None]
    assert not unpredicted, f"measured collectives nobody predicted: {unpredicted}\n{table}"
    assert all(r.match and r.measured_wire == r.predicted_wire for r in rows), table


def test_float32_step_moves_float32_bytes(grid):
    records, predicted, _, _ = one_step(grid, CASES["vocab13-buckets-clip"], dtype=np.float32)
    rows = compare(records, predicted)
    table = format_comparison(rows, title=f"float32, TP({grid.tp}) x DP({grid.dp})")
    assert all(r.match and r.measured_wire == r.predicted_wire for r in rows), table
    assert all(r["dtype"] in ("float32", "int64") for r in records if r["phase"] in ("forward", "backward", "data"))


def memory_forward(grid, dropout, sequence_parallel=False):
    """One forward of a small GPT (b 3, s 8: the sequence splits over every tp up to 8) with tracing paused."""
    cfg = GPTConfig(vocab_size=13, n_positions=8, n_embd=16, n_layer=2, n_head=8, dropout=dropout)
    model = build_gpt(cfg, grid.tp_group, seed=1, sequence_parallel=sequence_parallel)
    GradSync(model, grid.dp_group)  # gradients become views into the buckets: the bytes must not change
    ids, labels = np.random.default_rng(3).integers(0, cfg.vocab_size, (2, 3, 8))
    plan = DropoutPlan(ExactDropoutRNG(5), step=0) if dropout else DropoutPlan()
    with grid.tracer.paused():
        _, cache = model.forward(ids, labels, plan)
    return cfg, model, cache, ids, labels


def block_regions(block_cache) -> dict:
    """A block's cache split as ``block_activation_regions`` splits the formula.

    Block cache = (ln_1, attn, attn dropout mask, ln_2, mlp, mlp dropout mask); attn = (c_attn input, core,
    c_proj input); mlp = (c_fc input, GeLU input, c_proj input). The column-parallel inputs are LN outputs.
    """
    c_ln1, c_attn, k_attn, c_ln2, c_mlp, k_mlp = block_cache
    return {"ln_dropout": (c_ln1, c_attn[0], k_attn, c_ln2, c_mlp[0], k_mlp),
            "tensor_parallel": (c_attn[1:], c_mlp[1:])}


@pytest.mark.parametrize("sequence_parallel", [False, True], ids=["tp", "tp+sp"])
@pytest.mark.parametrize("dropout", [0.0, 0.2], ids=["no-dropout", "dropout"])
def test_memory_per_rank_matches_the_formulas(grid, dropout, sequence_parallel):
    cfg, model, cache, ids, labels = memory_forward(grid, dropout, sequence_parallel)
    b, s = ids.shape
    measured = measure_memory(model, AdamW(model), cache, exclude=(ids, labels))
    predicted = predict_memory(cfg, grid.tp, b, s, np.float64, tp_rank=grid.tp_rank,
                               sequence_parallel=sequence_parallel)
    table = format_memory(measured, predicted, title=f"TP({grid.tp}) rank {grid.tp_rank}, dropout {dropout}, "
                                                     f"sequence_parallel={sequence_parallel}:")
    for key, value in predicted.items():
        assert getattr(measured, key) == value, f"{key}\n{table}"
    assert measured.indices > 0, "owned ids, positions and target columns are integer arrays in the cache"
    # one block alone: GPT cache = (transformer, head, loss); transformer = (wte, wpe, mask, [blocks], ln_f)
    floats, masks = block_activation_elements(b, s, cfg.n_embd, cfg.n_head, grid.tp, dropout > 0, sequence_parallel)
    assert measure_activations(cache.transformer.h[0]) == {"activations": 8 * floats, "masks": masks, "indices": 0}


@pytest.mark.parametrize("dropout", [0.0, 0.2], ids=["no-dropout", "dropout"])
def test_sequence_parallel_divides_the_layernorm_dropout_region_by_tp(grid, dropout):
    """The same model and batch with and without SP: measured region by region, then the whole forward."""
    cfg, _, tp_cache, ids, _ = memory_forward(grid, dropout, sequence_parallel=False)
    _, _, sp_cache, _, _ = memory_forward(grid, dropout, sequence_parallel=True)
    b, s, t = *ids.shape, grid.tp
    tp_block, sp_block = (block_regions(c[0][3][0]) for c in (tp_cache, sp_cache))
    for region in ("ln_dropout", "tensor_parallel"):
        formula = block_activation_regions(b, s, cfg.n_embd, cfg.n_head, t, dropout > 0, sequence_parallel=True)
        measured = measure_activations(sp_block[region])
        assert measured == {"activations": 8 * formula[region][0], "masks": formula[region][1], "indices": 0}, region
    assert measure_activations(tp_block["ln_dropout"]) == {"activations": 8 * (4 * b * s * cfg.n_embd + 2 * b * s),
                                                           "masks": 2 * b * s * cfg.n_embd if dropout else 0,
                                                           "indices": 0}
    for kind in ("activations", "masks"):  # exactly 1/tp, and the heads/columns region untouched
        tp_ln, sp_ln = (measure_activations(r["ln_dropout"])[kind] for r in (tp_block, sp_block))
        assert sp_ln * t == tp_ln, f"{kind}: SP {sp_ln} x tp {t} != TP {tp_ln}"
        assert (measure_activations(sp_block["tensor_parallel"])[kind]
                == measure_activations(tp_block["tensor_parallel"])[kind]), kind
    # the two regions are the whole block (no buffer counted twice, none left out)
    for blocks, cache in ((tp_block, tp_cache), (sp_block, sp_cache)):
        whole = measure_activations(cache.transformer.h[0])
        assert whole == {k: sum(measure_activations(r)[k] for r in blocks.values()) for k in whole}
    # the whole forward, floats and masks: less under SP as soon as there is more than one rank to split over
    tp_bytes, sp_bytes = (sum(measure_activations(c, exclude=ids)[k] for k in ("activations", "masks"))
                          for c in (tp_cache, sp_cache))
    assert sp_bytes < tp_bytes if t > 1 else sp_bytes == tp_bytes, f"tp {t}: SP {sp_bytes} B, TP {tp_bytes} B"
