"""--tp-comm-overlap: SP's collectives pipelined chunk by chunk with their GEMMs, bit-identical to the blocking run.

Story: the same model drawn from one seed, built with and without the flag, trained three AdamW steps on the
same batches — losses, every gradient and every parameter equal *bit for bit* (float64 and bfloat16, GPT-2 and
Llama, every tp this world hosts). The trace of the overlapped run splits each pipelined collective into
t − 1 step records of one chunk each (the GEMMs they hid behind named), moving the same wire bytes as the
blocking collective; the re-gathers and the embedding's all-gather stay whole. The ordered reduce-scatter adds
in rank order; without SP or at tp 1 the flag is refused on every rank, before any collective.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pytest

from tpsim.arch.gpt2 import GPTConfig
from tpsim.arch.llama import LlamaConfig
from tpsim.comm.tracer import OverlapEvent
from tpsim.config import RunConfig
from tpsim.errors import ConfigError
from tpsim.nn.precision import bfloat16
from tpsim.train import AdamW, GradSync, dp_slice, mixed_precision
from tpsim.train.step import apply_update, compute_grads

BATCH, SEQ = 4, 8  # divisible by every dp and tp up to 8


def model_config(arch: str, tp: int):
    if arch == "gpt2":
        return GPTConfig(vocab_size=16 * tp + 3, n_positions=SEQ, n_embd=16, n_layer=2, n_head=8, dropout=0.0)
    return LlamaConfig(vocab_size=16 * tp + 3, hidden_size=16, intermediate_size=6 * tp, num_hidden_layers=2,
                       num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=SEQ, rope_theta=100.0)


def train_three_steps(grid, arch: str, dtype: str, overlap: bool):
    """Losses, gradients after each backward and parameters after the last update, as arrays on this rank."""
    run = RunConfig.of(model_config(arch, grid.tp), tp=grid.tp, dp=grid.dp, sp=True, tp_comm_overlap=overlap,
                       dtype=dtype, batch_size=BATCH, seq_len=SEQ, seed=5)
    model = run.build_model(grid.tp_group)
    opt = mixed_precision(model, lambda m: AdamW(m, lr=1e-2), grid.world)
    sync = GradSync(model, grid.dp_group, bucket_cap_bytes=4096) if grid.dp > 1 else None
    rng = np.random.default_rng(9)
    rows = np.arange(BATCH)[dp_slice(BATCH, grid.dp, grid.dp_rank)]
    losses, grads = [], []
    grid.tracer.reset()
    for step in range(3):
        ids, labels = rng.integers(0, 16 * grid.tp, (2, BATCH, SEQ))
        losses.append(compute_grads(model, grid, sync, ids[rows], labels[rows])[0])
        grads.append({name: g.copy() for name, g in model.named_grads()})
        apply_update(model, opt, grid, clip=1.0)
    params = {name: p.copy() for name, p in model.named_parameters()}
    return losses, grads, params, list(grid.tracer.events)


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


@pytest.mark.parametrize("dtype", ["float64", "bfloat16"])
@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_overlap_is_bit_identical_to_the_blocking_run(grid, arch, dtype):
    if grid.tp == 1:
        pytest.skip("--tp-comm-overlap needs tp > 1 (refused: test_tp_one_and_plain_tp_are_refused)")
    blocking = train_three_steps(grid, arch, dtype, overlap=False)
    overlapped = train_three_steps(grid, arch, dtype, overlap=True)
    assert overlapped[0] == blocking[0], f"losses {overlapped[0]} vs {blocking[0]}"
    for step, (got, want) in enumerate(zip(overlapped[1], blocking[1])):
        assert got.keys() == want.keys()
        bad = [n for n in want if not same_bits(got[n], want[n])]
        assert not bad, f"step {step}: gradients differ in {bad[:4]}"
    bad = [n for n in blocking[2] if not same_bits(overlapped[2][n], blocking[2][n])]
    assert not bad, f"parameters after 3 AdamW steps differ in {bad[:4]}"
    if dtype == "bfloat16":
        assert next(iter(blocking[2].values())).dtype == bfloat16


def wire_by_key(events):
    out = defaultdict(int)
    for e in events:
        if e.group == "tp" and e.op in ("all_gather", "reduce_scatter") and e.phase in ("forward", "backward"):
            out[e.scope, e.phase, e.op] += e.wire_bytes
    return dict(out)


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_trace_has_one_record_per_step_and_the_blocking_wire_bytes(grid, arch):
    if grid.tp == 1:
        pytest.skip("needs tp > 1")
    t = grid.tp
    blocking = train_three_steps(grid, arch, "float64", overlap=False)[3]
    overlapped = train_three_steps(grid, arch, "float64", overlap=True)[3]
    assert wire_by_key(overlapped) == wire_by_key(blocking)  # every chunk traced: the same bytes on the wire
    steps = [e for e in overlapped if isinstance(e, OverlapEvent)]
    assert steps and not any(isinstance(e, OverlapEvent) for e in blocking)
    runs, i = [], 0  # the steps of one collective are consecutive records 1 .. t−1
    while i < len(steps):
        one = steps[i:i + t - 1]
        assert [e.overlap_step for e in one] == list(range(1, t)), [e.overlap_step for e in one]
        assert all(e.overlap_steps == t - 1 and e.gemms == one[0].gemms and e.op == one[0].op for e in one)
        assert all(e.bytes == e.wire_bytes == one[0].bytes for e in one)
        runs.append(one[0])
        i += t - 1
    tokens = BATCH // grid.dp * SEQ
    assert all(m == tokens for e in runs for m, _, _ in e.gemms)  # every GEMM is over the whole sequence's rows
    whole = [e for e in overlapped if not isinstance(e, OverlapEvent) and e.op == "all_gather" and e.group == "tp"]
    # the blocking all-gathers left: each column-parallel layer's re-gather, the LM head's, the embedding's
    layers = 2 * 2 + 1 + 1  # two blocks × (attention, MLP), the LM head, the embedding's split backward
    assert len(whole) == 3 * layers, [(e.scope, e.phase) for e in whole[:8]]


def test_gemm_shapes_of_gpt_forward_are_the_layers(grid):
    if grid.tp == 1:
        pytest.skip("needs tp > 1")
    t, h = grid.tp, 16
    events = train_three_steps(grid, "gpt2", "float64", overlap=True)[3]
    m = BATCH // grid.dp * SEQ
    first = {}
    for e in events:
        if isinstance(e, OverlapEvent) and e.step == 0:
            first.setdefault((e.scope, e.phase, e.op), e.gemms)
    blk = "transformer.h.0"
    assert first[f"{blk}.attn.c_attn", "forward", "all_gather"] == ((m, 3 * h // t, h),)
    assert first[f"{blk}.attn.c_proj", "forward", "reduce_scatter"] == ((m, h, h // t),)
    assert first[f"{blk}.mlp.c_fc", "backward", "reduce_scatter"] == ((m, h, 4 * h // t),)
    assert first[f"{blk}.mlp.c_proj", "backward", "all_gather"] == ((m, 4 * h // t, h),)


def test_ordered_reduce_scatter_adds_in_rank_order(grid):
    g, t, r = grid.tp_group, grid.tp, grid.tp_rank
    rng = np.random.default_rng(3)
    every = rng.standard_normal((t, t, 2, 3)) * 10.0 ** rng.integers(-8, 8, (t, t, 2, 3))  # [rank, chunk, ...]
    got = g.reduce_scatter_in_rank_order(every[r], (t * 2, 3))
    want = every[0, r].copy()
    for i in range(1, t):
        want = want + every[i, r]
    assert got.tobytes() == want.tobytes()


def test_tp_one_and_plain_tp_are_refused():
    cfg = model_config("gpt2", 2)
    with pytest.raises(ConfigError, match="needs --sequence-parallel.*cannot hide"):
        RunConfig.of(cfg, tp=2, sp=False, tp_comm_overlap=True, batch_size=BATCH, seq_len=SEQ)
    with pytest.raises(ConfigError, match="needs --tp > 1"):
        RunConfig.of(cfg, tp=1, sp=True, tp_comm_overlap=True, batch_size=BATCH, seq_len=SEQ)
