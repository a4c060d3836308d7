"""The 16-bit policy (tpsim.nn.precision), the loss scaler's rule, and the formulas' itemsizes — no MPI."""

from __future__ import annotations

import numpy as np
import pytest

from tpsim.config import RunConfig
from tpsim.data import ReverseTask
from tpsim.models.build import serial_gpt
from tpsim.arch.gpt2 import GPTConfig
from tpsim.nn.layernorm import layernorm_forward
from tpsim.nn.precision import bfloat16, dtype_of, fp32_inside, grad_dtype, matmul, wgrad
from tpsim.phases import OPTIMIZER
from tpsim.predict.formulas import predict_step
from tpsim.train.loss_scale import DynamicLossScaler


def test_bfloat16_rounds_to_nearest_even():
    ulp = 2.0 ** -7  # bfloat16 keeps 7 fraction bits (8 significand bits): the spacing just above 1
    x = np.array([1 + ulp / 2, 1 + 3 * ulp / 2, 1 + ulp / 2 + 2.0 ** -20, -(1 + ulp / 2)], np.float32)
    got = x.astype(bfloat16).astype(np.float64)
    np.testing.assert_array_equal(got, [1.0, 1 + 2 * ulp, 1 + ulp, -1.0])  # ties go to the even neighbour


def test_matmul_emulates_tensor_cores_and_leaves_float32_alone():
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((5, 64)), rng.standard_normal((64, 3))
    a16, b16 = a.astype(bfloat16), b.astype(bfloat16)
    want = (a16.astype(np.float32) @ b16.astype(np.float32)).astype(bfloat16)
    got = matmul(a16, b16)
    assert got.dtype == bfloat16
    np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))
    assert wgrad(a16, b16).dtype == np.float32  # added into the float32 main gradient unrounded
    a32, b32 = a.astype(np.float32), b.astype(np.float32)
    np.testing.assert_array_equal(matmul(a32, b32), a32 @ b32)
    assert matmul(a, b).dtype == np.float64


def test_fp32_inside_rounds_the_activation_and_keeps_the_cache_float32():
    x = np.random.default_rng(1).standard_normal((4, 8)).astype(bfloat16)
    w, b = np.ones(8, bfloat16), np.zeros(8, bfloat16)
    y, cache = layernorm_forward(x, w, b)
    assert y.dtype == bfloat16 and cache.xhat.dtype == np.float32
    y32, _ = layernorm_forward(x.astype(np.float32), w.astype(np.float32), b.astype(np.float32))
    np.testing.assert_array_equal(y.view(np.uint16), y32.astype(bfloat16).view(np.uint16))
    assert fp32_inside(lambda v: v * 2)(np.float64(3.0)) == 6.0  # other dtypes pass through


@pytest.mark.parametrize("name,tol", [("bfloat16", 5e-2), ("float16", 1e-2)])
def test_16_bit_gpt_has_16_bit_weights_float32_main_grads_and_a_close_loss(name, tol):
    cfg = GPTConfig(vocab_size=11, n_positions=8, n_embd=16, n_layer=2, n_head=4)
    ids, labels = ReverseTask(11, 8).batch(0, 0, 3)
    ref = serial_gpt(cfg, seed=0, dtype=np.float64)
    loss64 = ref.loss_and_grads(ids, labels)
    model = serial_gpt(cfg, seed=0, dtype=dtype_of(name))
    loss = model.loss_and_grads(ids, labels)
    assert {p.dtype for _, p in model.named_parameters()} == {dtype_of(name)}
    assert {g.dtype for _, g in model.named_grads()} == {grad_dtype(dtype_of(name))} == {np.dtype(np.float32)}
    assert abs(loss - loss64) <= 1e-2 * loss64
    ref_grads = dict(ref.named_grads())
    for n, g in model.named_grads():
        scale = np.abs(ref_grads[n]).max()
        assert np.abs(g - ref_grads[n]).max() <= tol * scale + 1e-6, n


def test_loss_scaler_grows_backs_off_and_says_when_it_is_at_its_minimum():
    s = DynamicLossScaler(growth_interval=3)
    assert s.scale == 2.0 ** 16
    for _ in range(3):
        s.update(False)
    assert s.scale == 2.0 ** 17 and s.good_steps == 0
    s.update(False)
    s.update(True)  # an overflow: back off ×0.5, the count of clean steps restarts
    assert s.scale == 2.0 ** 16 and s.good_steps == 0 and s.skipped_steps == 1
    low = DynamicLossScaler(scale=2.0, min_scale=1.0)
    low.update(True)
    low.update(True)
    assert low.scale == 1.0 and low.at_minimum
    with pytest.raises(ValueError):
        DynamicLossScaler(growth_interval=0)


def test_formulas_use_2_byte_activations_and_float32_accumulations():
    cfg = GPTConfig(vocab_size=16, n_positions=8, n_embd=16, n_layer=1, n_head=4)
    rows = {p.key: p for p in predict_step(RunConfig.of(cfg, tp=2, dp=2, batch_size=4, dtype=bfloat16), clip=True)}
    fp16 = {p.key: p for p in predict_step(RunConfig.of(cfg, tp=2, dp=2, batch_size=4, dtype="float16"), clip=True)}
    b, s, h = 2, 8, 16
    assert rows[("transformer.h.0.mlp", "forward", "all_reduce", "tp")].bytes == b * s * h * 2
    assert rows[("loss", "forward", "all_reduce", "tp")].bytes == 3 * b * s * 4
    assert rows[("ddp", "dp_sync", "all_reduce", "dp")].bytes % 4 == 0
    assert ("loss_scaler", OPTIMIZER, "all_reduce", "world") not in rows  # bfloat16 needs no loss scaling
    assert fp16[("loss_scaler", OPTIMIZER, "all_reduce", "world")].bytes == 8  # float16's found-inf flag
    assert {k: (r.bytes, r.wire_bytes) for k, r in fp16.items() if k[0] != "loss_scaler"} == \
        {k: (r.bytes, r.wire_bytes) for k, r in rows.items()}  # otherwise the same 2- and 4-byte rows
    f32 = {p.key: p for p in predict_step(RunConfig.of(cfg, tp=2, dp=2, batch_size=4, dtype=np.float32), clip=True)}
    assert rows[("ddp", "dp_sync", "all_reduce", "dp")].bytes == f32[("ddp", "dp_sync", "all_reduce", "dp")].bytes
