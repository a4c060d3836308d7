"""Exercise 16 — two memory terms of a plan, by hand (lesson 16_planning_a_real_run.py).

Plain arithmetic, one process. The check compares your numbers with ``tpsim plan``'s own functions over many
layouts. Check it with:   tpsim check 16
The reference answer: tpsim lesson solution 16 (prints where it is) — try first.
"""

from __future__ import annotations


def model_state_bytes_per_gpu(params: int, dtype: str, zero: int, dp: int) -> float:
    """Bytes of weights, gradients and Adam's state that one GPU holding ``params`` parameters keeps.

    ``dtype``: "bf16" (bf16 weights, fp32 gradients), "fp16" (fp16 weights, gradients accumulated in fp32 as
    bf16's are) or "fp32" — the bytes per parameter lesson 16 gives each.
    ``zero``: 0, or 1 for the distributed optimizer (ZeRO stage 1) over ``dp`` data-parallel replicas.
    Returns bytes (not GB or GiB); the count need not be a whole number under ZeRO-1.
    """
    # TODO: bytes per parameter (weights + gradients + optimizer state) times the parameters.
    raise NotImplementedError


def gpt_layer_activation_bytes(s: int, b: int, h: int, a: int, t: int, sp: bool, recompute: str) -> float:
    """Korthikanti et al. 2022, Table 2: bytes one GPT layer keeps for its backward on one GPU.

    ``s`` sequence, ``b`` micro-batch, ``h`` hidden, ``a`` heads, ``t`` TP size; ``sp``: sequence parallelism;
    ``recompute``: "none", "selective" (the attention scores are recomputed) or "full" (only the layer's input
    is kept: 2sbh as in Table 2 — under SP its sequence shard, 2sbh/t, as Megatron-LM keeps it). Table 2's rows are
    already in bytes, with
    16-bit activations and 1-byte dropout masks.
    """
    # TODO: one line of Table 2 per case.
    raise NotImplementedError
