"""Reference answer to exercise 16 — two memory terms of a plan, by hand (lesson 16_planning_a_real_run.py)."""

from __future__ import annotations

BYTES_PER_PARAM = {"bf16": (2, 4, 12), "fp16": (2, 4, 12), "fp32": (4, 4, 8)}  # weights, grads, optimizer


def model_state_bytes_per_gpu(params: int, dtype: str, zero: int, dp: int) -> float:
    weights, grads, optimizer = BYTES_PER_PARAM[dtype]
    if zero:
        optimizer = optimizer / dp  # ZeRO-1 splits the optimizer state only
    return params * (weights + grads + optimizer)


def gpt_layer_activation_bytes(s: int, b: int, h: int, a: int, t: int, sp: bool, recompute: str) -> float:
    if recompute == "full":
        return 2 * s * b * h / (t if sp else 1)  # the layer's input; under SP each GPU keeps its s/t rows
    scores = 0 if recompute == "selective" else 5 * a * s / h
    if sp:
        return s * b * h / t * (34 + scores)
    return s * b * h * (10 + 24 / t + scores / t)
