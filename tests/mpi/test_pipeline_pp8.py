"""Eight pipeline stages on eight live ranks (pp 8, one rank per stage): the deepest pipeline the world holds.

At pp 8 the warm-up of 1F1B is p − i − 1 = 7 forwards on the first rank and none on the last, and the tied
embedding's two copies sit seven hops apart; a schedule or a send that is right at pp 2 and 4 can still be wrong
here. Per schedule — afab, 1f1b and zb-h1 over 8 layers (GPT-2 and Llama), interleaved over 16 layers with
vp 2 — step 0's loss and every gradient of every stage equal the serial model's (float64, 1e-12), the peak of
micro-batches in flight is the schedule's formula on every rank (afab m; 1f1b min(p − i, m); zb-h1 min(p, m);
interleaved ``tpsim.predict.pipeline.peak_in_flight``), and the live unit clock's bubble is the schedule's
formula ((p − 1)/(v·m + p − 1); zb-h1 (p − 1)/(3m + p − 1) at m ≥ p).
Runs at world 8 only (skipped elsewhere).
"""

from __future__ import annotations

import numpy as np
import pytest

from tpsim.arch import GPTConfig, LlamaConfig, architecture_of
from tpsim.comm import ProcessGrid
from tpsim.compare import relative_difference
from tpsim.nn.dropout import DropoutPlan
from tpsim.pipeline.schedules import build
from tpsim.live_pipeline.build import pipeline_from_serial
from tpsim.live_pipeline.clock import bubble_measured
from tpsim.live_pipeline.executor import Executor
from tpsim.live_pipeline.split import split_layers
from tpsim.live_pipeline.step import pipeline_grads
from tpsim.predict.pipeline import bubble_fraction, peak_in_flight
from tpsim.tp.random import ExactDropoutRNG
from conftest import WORLD
from test_pipeline_parallel import assert_everywhere, assert_grads_equal_serial

PP = 8
TOL = 1e-12
B_MICRO, SEQ, SEED = 1, 5, 7
M = 11  # more micro-batches than stages: 1F1B's peaks are p − i, afab's m, two different lists
pytestmark = pytest.mark.skipif(WORLD.Get_size() != PP, reason=f"pp {PP} needs exactly {PP} ranks")
_GRID: list[ProcessGrid] = []


def pp8_grid() -> ProcessGrid:
    if not _GRID:  # built once: communicators are a finite resource
        _GRID.append(ProcessGrid(tp=1, pp=PP))
    _GRID[0].tracer.reset()
    return _GRID[0]


def model_config(arch: str, layers: int):
    if arch == "gpt2":  # tied embedding (first and last stage), dropout with the exact RNG
        return GPTConfig(vocab_size=13, n_positions=SEQ, n_embd=8, n_layer=layers, n_head=2, dropout=0.1)
    return LlamaConfig(vocab_size=13, hidden_size=8, intermediate_size=16, num_hidden_layers=layers,
                       num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=SEQ)


def global_batch(cfg, rows: int):
    rng = np.random.default_rng(3)
    ids, labels = rng.integers(0, cfg.vocab, (rows, SEQ)), rng.integers(0, cfg.vocab, (rows, SEQ))
    labels[rng.random((rows, SEQ)) < 0.3] = -100  # padding: micro-batches hold different token counts
    return ids, labels




def check_step0(arch: str, schedule: str, vp: int, m: int) -> None:
    grid = pp8_grid()
    layers = PP * vp
    cfg = model_config(arch, layers)
    serial = architecture_of(cfg).serial(cfg, seed=SEED)
    shard = pipeline_from_serial(serial, grid, split_layers(layers, PP * vp, vp=vp))
    assert [c.stage for c in shard.chunks] == [c * PP + grid.pp_rank for c in range(vp)]
    sch = build(schedule, PP, m, vp)
    ex = Executor(sch, shard.chunks, grid.pp_group, (B_MICRO, SEQ, cfg.hidden), np.float64)
    ids, labels = global_batch(cfg, B_MICRO * m)
    loss, tokens, result = pipeline_grads(shard, ex, grid, None, ids, labels, rows=np.arange(B_MICRO * m),
                                          rng=ExactDropoutRNG(SEED), step=0)

    loss_s = serial.loss_and_grads(ids, labels, DropoutPlan(ExactDropoutRNG(SEED), 0))
    assert_everywhere(relative_difference(loss, loss_s, floor=0.0) <= TOL, f"loss {loss} vs serial {loss_s}")
    assert_everywhere(tokens == int(np.count_nonzero(labels != -100)), f"tokens {tokens}")
    assert_grads_equal_serial(shard, serial)

    want = peak_in_flight(schedule, PP, m, vp)[grid.pp_rank]
    if vp == 1:  # the formulas in words, independently of tpsim.predict
        assert want == {"afab": m, "1f1b": min(PP - grid.pp_rank, m), "zb-h1": min(PP, m)}[schedule]
    assert_everywhere(result.peak_in_flight == want, f"peak in flight {result.peak_in_flight}, expected {want}")
    peaks = WORLD.allgather(result.peak_in_flight)
    if schedule == "1f1b":
        assert peaks == [PP - i for i in range(PP)], peaks  # m > p: every rank's own warm-up decides
    clocks = WORLD.allgather((result.clock.time, result.clock.busy))
    _, idle = bubble_measured(clocks)
    formula = bubble_fraction(schedule, PP, m, vp)
    assert abs(idle - formula) <= 1e-9, (idle, formula)


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
@pytest.mark.parametrize("schedule", ["afab", "1f1b"])
def test_pp8_step0_equals_serial_with_the_schedules_peaks(schedule, arch):
    check_step0(arch, schedule, vp=1, m=M)


def test_pp8_interleaved_vp2_step0_equals_serial_with_the_formulas_peaks():
    """16 layers, two chunks per rank (virtual stages r and 8 + r), m = 16 (a multiple of pp, as interleaving
    needs): the embedding on rank 0's chunk 0, the head on rank 7's chunk 1."""
    check_step0("gpt2", "interleaved", vp=2, m=2 * PP)


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
@pytest.mark.parametrize("m", [M, 3])
def test_pp8_zb_h1_step0_equals_serial_with_its_peaks_and_bubble(arch, m):
    """ZB-H1 over 8 layers, the backward split into B and W on every stage: m ≥ p (bubble (p − 1)/(3m + p − 1),
    every rank holds min(p, m) until its W's) and m < p ((2p − 1 − m)/(2m + 2p − 1))."""
    check_step0(arch, "zb-h1", vp=1, m=m)
