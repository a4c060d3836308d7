"""Memory per rank: what the live arrays hold, beside the formulas that predict it.

Measured (``measure_memory``), in bytes on this rank:

    params, grads     every parameter / gradient array of the model (a tied weight once; its local shard)
    optimizer         ``optimizer.state_bytes()`` (AdamW: two shard-sized arrays per parameter)
    activations       float arrays reachable from the cache tree ``model.forward`` returned
    masks, indices    bool arrays (owned-id masks, valid-target masks, dropout masks) and integer arrays
                      (owned ids, positions, target columns) in that tree — the integer ones depend on the data

Each array of the cache is counted through the buffer that owns its memory (``a.base`` followed to the end),
once: q, k and v are views of one qkv buffer, and a view keeps its whole base alive.

Formulas, with b the local batch, s the sequence, h hidden, a heads, t the TP size, L layers, V the vocabulary
padded to Vp (a multiple of t), and r the split of the LayerNorm/dropout regions: r = 1 under plain TP (every
rank holds the whole [b, s, h]), r = t under sequence parallelism ([b, s/t, h]). Ours are exact — derived from
what tpsim's layers cache, elements per rank:

    per block, floats   (4bsh + 2bs)/r        LayerNorm x̂ and rstd ×2, the LN outputs fed to c_attn and c_fc
                        + 12bsh/t             qkv (3h/t), context (h/t), GeLU input and output (4h/t each)
                        + (a/t)·b·s²          attention probabilities  (+ the same again, dropped, if p > 0)
               masks    (dropout only)        2bsh/r residual-dropout masks + (a/t)·b·s² attention mask
    once, floats        (bsh + bs)/r (ln_f x̂, rstd) + bsh/r (LM head input) + b·s·n_real (the loss's softmax
                        over this rank's real vocabulary columns, n_real ≤ Vp/t)
          masks         2bs (owned ids, valid targets) + bsh/r embedding-dropout mask if p > 0

Sequence parallelism (r = t), from what the SP layers keep. ``SequenceParallelLayerNorm`` normalises this
rank's [b, s/t, h], so x̂ and rstd are [b, s/t, h] and [b, s/t, 1]. ``ColumnParallelLinear(sequence_parallel=
True)`` caches only its [b, s/t, h] input shard: f̄'s gathered [b, s, h] lives for the forward call and is
gathered again in backward, so c_attn's and c_fc's cached inputs are ÷ t too. The residual dropouts act on ḡ's
[b, s/t, h] output and the embedding dropout comes after the scatter: their masks are ÷ t. ln_f normalises a
shard and the LM head keeps that shard. Between f̄ and ḡ nothing changes: attention and the MLP see the whole
sequence on their own heads and columns, so qkv, context, probabilities and GeLU in and out are what plain TP
keeps. Neither do the loss's softmax (logits [b, s, Vp/t]) and the index arrays (the lookup runs on all of
[b, s], before the scatter). SP at t = 1 is plain TP at t = 1. ``block_activation_regions`` gives the two parts
of a block separately: the LayerNorm/dropout region (÷ r) and the tensor-parallel region (÷ t either way).

Reference: Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models" (2022),
Table 2 — activation bytes per transformer layer with 16-bit activations and 1-byte dropout masks:

    no parallelism            s·b·h·(34 + 5·a·s/h)
    tensor parallel           s·b·h·(10 + 24/t + 5·a·s/(h·t))
    tensor + sequence par.    s·b·h/t·(34 + 5·a·s/h)

In elements (``korthikanti_layer_elements``, Korthikanti et al. §4.1) a layer holds 4sbh/r + 12sbh/t
+ 2·(a/t)·b·s² floats (LN inputs, the QKV and MLP inputs, q k v, the projection input, GeLU in and out, softmax
output and its dropout) and 2sbh/r + (a/t)·b·s² masks; 2 bytes a float plus 1 a mask gives each line above.

Why ours differs: every term but one agrees element for element, under TP and under TP + SP alike. tpsim
caches LayerNorm's normalised output x̂ and its rstd where Megatron keeps the LN input — 2bs/r floats more —
holds no dropout masks when p = 0 (the paper always counts them), and stores float64, 8 bytes an element, not
16-bit. With dropout on and ours counted at 2 bytes a float and 1 a mask, a layer equals the paper's line plus
the 4·b·s/r bytes of the two rstd vectors, at r = 1 for TP and r = t for TP + SP:

    TP + SP    2·[(16bsh + 2bs)/t + 2·(a/t)·b·s²] + 2bsh/t + (a/t)·b·s²  =  s·b·h/t·(34 + 5·a·s/h) + 4·b·s/t

(``tests/test_formulas.py`` checks both identities.)
"""

from __future__ import annotations

import numpy as np

from tpsim.partition import padded_vocab_size
from tpsim.predict.model_state import zero_optimizer_bytes
from tpsim.predict.llama_memory import is_llama, llama_activation_elements, llama_param_elements

# --- model state -----------------------------------------------------------------------------------------------


def param_elements(config, tp: int) -> int:
    """Parameter elements one TP rank holds: its shards plus every replicated tensor; the tied head once.

    A ``LlamaConfig``: ``tpsim.predict.llama_memory.llama_param_elements``. For the GPT:

    ``wte [Vp/t, h] + wpe [n_positions, h] + L·(12h²/t + 7h/t + 6h) + ln_f 2h``: c_attn, c_proj's weight and
    the MLP weights and column biases are sharded; LayerNorms (4h) and the two row-parallel biases (2h) are not.
    """
    if is_llama(config):
        return llama_param_elements(config, tp)
    h, L = config.n_embd, config.n_layer
    vocab = padded_vocab_size(config.vocab_size, tp) // tp * h
    return vocab + config.n_positions * h + L * block_param_elements(h, tp) + 2 * h


def block_param_elements(h: int, tp: int) -> int:
    """Parameter elements of one GPT block on one TP rank: ``(12h² + 7h)/t`` sharded + ``6h`` replicated."""
    return (12 * h * h + 7 * h) // tp + 6 * h


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


def block_activation_regions(b: int, s: int, h: int, heads: int, tp: int, dropout: bool = False,
                             sequence_parallel: bool = False) -> dict[str, tuple[int, int]]:
    """``(float elements, mask elements)`` one block caches on one rank, by region (see the module docstring).

    ``"ln_dropout"``: LayerNorm x̂ and rstd, the LN outputs the two column-parallel layers keep, the residual
    dropout masks — [b, s, h] under TP, [b, s/t, h] under SP. ``"tensor_parallel"``: qkv, context, GeLU in and
    out, attention probabilities (and their dropout) — split by heads and columns, the same with or without SP.
    """
    r = tp if sequence_parallel else 1
    if s % r:
        raise ValueError(f"sequence length {s} is not divisible by tp {tp} (sequence parallelism)")
    probs = heads // tp * b * s * s
    ln_dropout = ((4 * b * s * h + 2 * b * s) // r, 2 * b * s * h // r if dropout else 0)
    tensor_parallel = (12 * b * s * h // tp + probs * (2 if dropout else 1), probs if dropout else 0)
    return {"ln_dropout": ln_dropout, "tensor_parallel": tensor_parallel}


def block_activation_elements(b: int, s: int, h: int, heads: int, tp: int, dropout: bool = False,
                              sequence_parallel: bool = False) -> tuple[int, int]:
    """``(float elements, mask elements)`` one transformer block caches on one rank (see the module docstring)."""
    regions = block_activation_regions(b, s, h, heads, tp, dropout, sequence_parallel).values()
    return sum(f for f, _ in regions), sum(m for _, m in regions)


def real_vocab_columns(vocab_size: int, tp: int, tp_rank: int) -> int:
    """Columns of the real (unpadded) vocabulary that TP rank ``tp_rank`` holds."""
    per_rank = padded_vocab_size(vocab_size, tp) // tp
    return min(max(vocab_size - tp_rank * per_rank, 0), per_rank)


def activation_elements(config, tp: int, batch: int, seq: int, tp_rank: int = 0, dropout: bool | None = None,
                        sequence_parallel: bool = False) -> dict[str, int]:
    """``{"floats", "masks"}``: elements the GPT forward caches on TP rank ``tp_rank``, ``batch`` = local rows.

    ``dropout`` defaults to ``config.dropout > 0`` (pass False for a forward without a dropout RNG);
    ``sequence_parallel`` for a model built with ``build_gpt(..., sequence_parallel=True)``.
    """
    if is_llama(config):  # no dropout
        return llama_activation_elements(config, tp, batch, seq, real_vocab_columns(config.vocab_size, tp, tp_rank),
                                         sequence_parallel)
    dropout = config.dropout > 0 if dropout is None else dropout
    b, s, h = batch, seq, config.n_embd
    floats, masks = block_activation_elements(b, s, h, config.n_head, tp, dropout, sequence_parallel)
    r = tp if sequence_parallel else 1  # the split of ln_f, the LM head's input and the embedding dropout
    softmax = b * s * real_vocab_columns(config.vocab_size, tp, tp_rank)
    floats = config.n_layer * floats + (2 * b * s * h + b * s) // r + softmax
    masks = config.n_layer * masks + 2 * b * s + (b * s * h // r if dropout else 0)
    return {"floats": floats, "masks": masks}


def korthikanti_layer_bytes(s: int, b: int, h: int, a: int, t: int = 1, sequence_parallel: bool = False) -> float:
    """Korthikanti et al. (2022) Table 2: activation bytes of one transformer layer, 16-bit activations.

    ``t == 1`` gives the no-parallelism line; ``sequence_parallel`` the tensor + sequence parallel line.
    """
    sbh = s * b * h
    if sequence_parallel:
        return sbh / t * (34 + 5 * a * s / h)
    if t == 1:
        return sbh * (34 + 5 * a * s / h)
    return sbh * (10 + 24 / t + 5 * a * s / (h * t))


def korthikanti_layer_elements(s: int, b: int, h: int, a: int, t: int = 1,
                               sequence_parallel: bool = False) -> tuple[float, float]:
    """The same layer as ``(float elements, mask elements)``, so it can be priced at any dtype.

    2 bytes a float + 1 a mask is ``korthikanti_layer_bytes``; ``itemsize · floats + masks`` is the paper's
    count at tpsim's dtype (float64 arrays, bool masks).
    """
    r = t if sequence_parallel else 1
    sbh, probs = s * b * h, a * s * s * b / t
    return 4 * sbh / r + 12 * sbh / t + 2 * probs, 2 * sbh / r + probs


def predict_memory(config, tp: int, batch: int, seq: int, dtype, tp_rank: int = 0, optimizer_slots: int = 2,
                   dropout: bool | None = None, sequence_parallel: bool = False, zero_dp: int = 0) -> dict[str, int]:
    """Our formulas as bytes, keyed like ``MemoryReport`` (no ``indices``: they depend on the data).

    Parameters, gradients and optimizer state are the same with or without ``sequence_parallel``; ``zero_dp``:
    ZeRO-1's optimizer state (see ``model_state_bytes``).
    """
    act = activation_elements(config, tp, batch, seq, tp_rank, dropout, sequence_parallel)
    return {**model_state_bytes(config, tp, dtype, optimizer_slots, zero_dp),
            "activations": act["floats"] * np.dtype(dtype).itemsize, "masks": act["masks"]}
