"""Memory per rank: what the live arrays hold, beside the formulas that predict it.

Measured (``measure_memory``), in bytes on this rank:

    params, grads     every parameter / gradient array of the model (a tied weight once; its local shard)
    optimizer         ``optimizer.state_bytes()`` (AdamW: two shard-sized arrays per parameter)
    activations       float arrays reachable from the cache tree ``model.forward`` returned
    masks, indices    bool arrays (owned-id masks, valid-target masks, dropout masks) and integer arrays
                      (owned ids, positions, target columns) in that tree — the integer ones depend on the data

Each array of the cache is counted through the buffer that owns its memory (``a.base`` followed to the end),
once: q, k and v are views of one qkv buffer, and a view keeps its whole base alive.

Formulas, elements per rank, with t the TP size, h hidden, L layers and V the vocabulary padded to Vp (a
multiple of t). Parameters, for every architecture alike: the embedding's [Vp/t, h] shard (twice when the LM
head is untied), a learned position table whole, L layers, the final norm (``norm_params`` vectors of h):

    Vp/t·h·(1 if tied else 2) + [max_positions·h] + L·layer_param_elements + norm_params·h

What one layer holds, and what the forward caches, is the architecture's own: ``tpsim.predict.gpt_memory``
(LayerNorm, GeLU MLP, dropout; Korthikanti et al.'s Table 2 beside it) and ``tpsim.predict.llama_memory``
(RMSNorm, SwiGLU, RoPE, grouped-query attention), reached through the registry (``tpsim.arch``).
"""

from __future__ import annotations

import numpy as np

from tpsim.arch import architecture_of
from tpsim.partition import padded_vocab_size
from tpsim.predict.model_state import zero_optimizer_bytes

# --- model state -----------------------------------------------------------------------------------------------


def param_elements(config, tp: int) -> int:
    """Parameter elements one TP rank holds: its shards plus every replicated tensor; the tied head once
    (the module docstring's formula); an architecture with its own count (experts) gives it."""
    terms = architecture_of(config).memory
    if hasattr(terms, "param_elements"):
        return terms.param_elements(config, tp)
    h = config.hidden
    vocab = padded_vocab_size(config.vocab, tp) // tp * h
    table = config.max_positions * h if config.position_table else 0
    layer = architecture_of(config).memory.layer_param_elements(config, tp)
    return vocab * (1 if config.tied else 2) + table + config.layers * layer + config.norm_params * h


def model_state_bytes(config, tp: int, dtype, optimizer_slots: int = 2, zero_dp: int = 0) -> dict[str, int]:
    """``{"params", "grads", "optimizer"}`` bytes per rank; ``optimizer_slots`` 2 for AdamW, 1 SGD+momentum.

    ``zero_dp`` d > 0: ZeRO-1 over d DP ranks (one gradient bucket): the state covers this rank's 1/d of the
    bucket padded to a multiple of d (``tpsim.predict.model_state``); parameters and gradients stay whole.
    """
    elements, itemsize = param_elements(config, tp), np.dtype(dtype).itemsize
    n = elements * itemsize
    optimizer = optimizer_slots * n
    if zero_dp:
        optimizer = zero_optimizer_bytes([elements], zero_dp, itemsize, optimizer_slots)
    return {"params": n, "grads": n, "optimizer": optimizer}


# --- activation formulas ---------------------------------------------------------------------------------------


# --- activation formulas ---------------------------------------------------------------------------------------


def real_vocab_columns(vocab_size: int, tp: int, tp_rank: int) -> int:
    """Columns of the real (unpadded) vocabulary that TP rank ``tp_rank`` holds."""
    per_rank = padded_vocab_size(vocab_size, tp) // tp
    return min(max(vocab_size - tp_rank * per_rank, 0), per_rank)


def activation_elements(config, tp: int, batch: int, seq: int, tp_rank: int = 0, dropout: bool | None = None,
                        sequence_parallel: bool = False) -> dict[str, int]:
    """``{"floats", "masks"}``: elements the forward caches on TP rank ``tp_rank``, ``batch`` = local rows (the
    architecture's ``activation_elements``; ``dropout`` defaults to the config's, a Llama has none)."""
    n_real = real_vocab_columns(config.vocab, tp, tp_rank)
    return architecture_of(config).memory.activation_elements(config, tp, batch, seq, n_real, dropout,
                                                              sequence_parallel)


def predict_memory(config, tp: int, batch: int, seq: int, dtype, tp_rank: int = 0, optimizer_slots: int = 2,
                   dropout: bool | None = None, sequence_parallel: bool = False, zero_dp: int = 0) -> dict[str, int]:
    """Our formulas as bytes, keyed like ``MemoryReport`` (no ``indices``: they depend on the data).

    Parameters, gradients and optimizer state are the same with or without ``sequence_parallel``; ``zero_dp``:
    ZeRO-1's optimizer state (see ``model_state_bytes``).
    """
    act = activation_elements(config, tp, batch, seq, tp_rank, dropout, sequence_parallel)
    return {**model_state_bytes(config, tp, dtype, optimizer_slots, zero_dp),
            "activations": act["floats"] * np.dtype(dtype).itemsize, "masks": act["masks"]}
