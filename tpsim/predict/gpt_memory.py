"""Memory per rank of the GPT (``tpsim.models.build``): parameters and cached activations, as formulas — the
terms ``tpsim.arch`` reaches for the ``gpt2`` entry (every architecture's module has the same four:
``layer_param_elements``, ``layer_vector_elements``, ``activation_elements``, ``paper_layer_elements``).

With b the local batch, s the sequence, h hidden, a heads, t the TP size, L layers, V the vocabulary
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
rank's [b, s/t, h], so x̂ and rstd are [b, s/t, h] and [b, s/t, 1]. ``ColumnParallelLinear(region=
SP_REGION)`` caches only its [b, s/t, h] input shard: f̄'s gathered [b, s, h] lives for the forward call and is
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

The planner (``paper_layer_elements``) counts a layer as Korthikanti et al. do, with 16-bit activations and
1-byte dropout masks: ``tpsim.plan.memory`` prices it and adds tpsim's own rstd apart.
"""

from __future__ import annotations

ACTIVATION_SOURCE = "Korthikanti Table 2"  # where the planner's activation count per layer comes from


def block_param_elements(h: int, tp: int) -> int:
    """Parameter elements of one GPT block on one TP rank: ``(12h² + 7h)/t`` sharded + ``6h`` replicated."""
    return (12 * h * h + 7 * h) // tp + 6 * h


def layer_param_elements(shape, tp: int) -> int:
    """Parameter elements of one layer on one TP rank (``block_param_elements``; the MLP is 4h wide)."""
    return block_param_elements(shape.hidden, tp)


def layer_vector_elements(shape) -> int:
    """Parameters of one layer outside its matmuls: two LayerNorms (4h) and the four linears' biases (9h)."""
    return 13 * shape.hidden


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


def activation_elements(config, tp: int, batch: int, seq: int, n_real: int, dropout: bool | None = None,
                        sequence_parallel: bool = False) -> dict[str, int]:
    """``{"floats", "masks"}``: elements the GPT forward caches on one TP rank, ``batch`` = local rows, ``n_real``
    the rank's real vocabulary columns. ``dropout`` defaults to ``config.dropout > 0`` (pass False for a forward
    without a dropout RNG); ``sequence_parallel`` for a model built with ``build_gpt(..., sequence_parallel=True)``.
    """
    dropout = config.dropout > 0 if dropout is None else dropout
    b, s, h = batch, seq, config.n_embd
    floats, masks = block_activation_elements(b, s, h, config.n_head, tp, dropout, sequence_parallel)
    r = tp if sequence_parallel else 1  # the split of ln_f, the LM head's input and the embedding dropout
    softmax = b * s * n_real
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


def paper_layer_elements(shape, b: int, s: int, t: int, sp: bool, selective: bool) -> tuple[float, float, float]:
    """``(floats, masks, tpsim's own floats)`` of one layer as Korthikanti et al. count it (Table 2, in elements);
    ``selective`` recompute drops the softmax output, its dropout and its mask. tpsim's own term beyond the
    norms' rstd (added by the planner): none."""
    floats, masks = korthikanti_layer_elements(s, b, shape.hidden, shape.heads, t, sp)
    if selective:
        a = shape.heads
        floats, masks = floats - 2 * a * s * s * b / t, masks - a * s * s * b / t
    return floats, masks, 0.0


ATTENTION_DROPOUT = True  # GPT-2 drops out attention probabilities (tpsim.plan.kernels prices the pass)


def layer_matmuls(shape, tp: int) -> list[tuple[str, int, int]]:
    """One layer's weight matmuls on one TP rank as ``(name, in, out)`` in forward order (``tpsim.plan.kernels``):
    QKV h → 3h/t, the projection h/t → h, the MLP h → 4h/t → h."""
    h, f = shape.hidden, shape.ffn
    return [("qkv", h, 3 * h // tp), ("proj", h // tp, h), ("fc1", h, f // tp), ("fc2", f // tp, h)]


def layer_passes(shape, tokens: int, tp: int, sp: bool, e: int) -> list[tuple[str, float, int]]:
    """One layer's memory-bound forward passes as ``(name, bytes, slot)`` in forward order, scores apart (slot k:
    after the k-th of qkv, attention, proj, the MLP's first and second matmul; 0 before qkv): LayerNorm
    (read, write), fused bias-dropout-add (read the output and the residual, write, a 1-byte mask), LayerNorm,
    fused bias-GeLU on the 4h/t columns, bias-dropout-add; the norm regions hold tokens/t rows under SP."""
    rows = tokens * shape.hidden / (tp if sp else 1)
    return [("norm", 2 * e * rows, 0), ("bias_dropout_add", (3 * e + 1) * rows, 3), ("norm", 2 * e * rows, 3),
            ("bias_gelu", 2 * e * tokens * shape.ffn / tp, 4), ("bias_dropout_add", (3 * e + 1) * rows, 5)]
