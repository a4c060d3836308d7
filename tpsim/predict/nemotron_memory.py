"""Memory per rank of the Nemotron (``tpsim.models.nemotron``): parameters and cached activations, as formulas.

The terms ``tpsim.arch`` reaches for the ``nemotron`` entry, pure arithmetic (no MPI). With b the local batch,
s the sequence, h hidden, a query heads, k KV heads, d = h / a, r_d the rotary features of a head
(partial_rotary_factor · d), F the intermediate size, t the TP size, k_t = max(k / t, 1) and r the split of the
norm regions (1 under TP, t under SP), elements per rank:

    parameters   embed_tokens and lm_head (Vp/t)·h each + L·(2h²/t + 2·h·d·k_t + 2hF/t + 4h) + 2h
    per block    floats (4bsh + 2bs)/r        the two LayerNorm1Ps' x̂ and rstd, their outputs fed to q/k/v, up
                        + 4bsh/t              q and k after RoPE, v (repeated to the rank's a/t heads), o_proj's
                                              input
                        + (a/t)·b·s²          attention probabilities
                        + 2bsF/t              up_proj's output (relu²'s input) and relu²'s output (down's input)
                        + 2·s·r_d             RoPE's cos and sin (the turned features only)
    once         floats (bsh + bs)/r (the final norm's x̂, rstd) + bsh/r (lm_head input) + b·s·n_real (the loss's
                 softmax); masks 2bs (owned ids, valid targets); no dropout

The Llama's count (``tpsim.predict.llama_memory``) but for the MLP (two matrices and two [s, F] activations,
not SwiGLU's three and four), the norms' biases (2h a norm) and RoPE's narrower tables. LayerNorm1P's scale
1 + w is a fresh [h] vector a forward, a parameter's, not counted. tests/mpi/test_nemotron_formulas.py measures
them on live caches at TP 1, 2, 4, 8, with and without SP.

The planner (``paper_layer_elements``) counts a layer in Megatron's way: 4sbh/r (both norms' inputs and
outputs) + 2sbh/t (q after RoPE, the context) + 2·s·b·d·k_t (k and v) + 2sbF/t (relu²'s input and output) +
a·s²·b/t (softmax output; removed by selective recompute), and apart tpsim's own: k and v repeated to every
local q head (2sbh/t − 2·s·b·d·k_t) and RoPE's cos/sin (2·s·r_d), besides the norms' rstd the planner adds.
"""

from __future__ import annotations

from tpsim.arch.shape import kv_heads_per_rank
from tpsim.predict.llama_memory import decoder_activation_elements

ACTIVATION_SOURCE = "derived (Megatron's counting)"  # where the planner's activation count per layer comes from
ATTENTION_DROPOUT = False  # no dropout


def rotary_features(shape) -> int:
    """r_d: the features of a head RoPE turns (the config's ``rotary_dim``; a planner ModelSpec has none: d/2)."""
    return getattr(shape, "rotary_dim", shape.head_dim // 2)


def layer_param_elements(shape, tp: int) -> int:
    """Parameter elements of one decoder layer on one TP rank: q and o_proj (2·h·a·d/t), up and down (2hF/t),
    k and v_proj of this rank's KV heads (2·h·d·k_t) and the two LayerNorm1Ps' weights and biases (4h)."""
    h, d, a, f = shape.hidden, shape.head_dim, shape.heads, shape.ffn
    return (2 * h * a * d + 2 * h * f) // tp + 2 * h * d * kv_heads_per_rank(shape, tp) + 4 * h


def layer_vector_elements(shape) -> int:
    """Parameters of one layer outside its matmuls: the two norms' weights and biases."""
    return 4 * shape.hidden


def block_activation_elements(config, tp: int, b: int, s: int, sequence_parallel: bool = False) -> int:
    """Float elements one decoder layer caches on one rank (the module docstring); it holds no masks."""
    r = tp if sequence_parallel else 1
    if s % r:
        raise ValueError(f"sequence length {s} is not divisible by tp {tp} (sequence parallelism)")
    h, heads = config.hidden_size, config.num_attention_heads
    return ((4 * b * s * h + 2 * b * s) // r + 4 * b * s * h // tp + heads // tp * b * s * s
            + 2 * b * s * config.intermediate_size // tp + 2 * s * config.rotary_dim)


def activation_elements(config, tp: int, batch: int, seq: int, n_real: int, dropout: bool | None = None,
                        sequence_parallel: bool = False) -> dict[str, int]:
    """``{"floats", "masks"}`` the Nemotron's forward caches on one rank; ``n_real``: its real vocabulary
    columns; ``dropout`` is not used (none)."""
    block = block_activation_elements(config, tp, batch, seq, sequence_parallel)
    return decoder_activation_elements(config, tp, batch, seq, n_real, block, sequence_parallel)


def paper_layer_elements(shape, b: int, s: int, t: int, sp: bool, selective: bool) -> tuple[float, float, float]:
    """``(floats, masks, tpsim's own floats)`` of one layer in Megatron's counting (the module docstring)."""
    h, a, r = shape.hidden, shape.heads, t if sp else 1
    sbh, sbf, hd = s * b * h, s * b * shape.ffn, shape.head_dim
    kv = 2 * s * b * hd * kv_heads_per_rank(shape, t)
    floats = 4 * sbh / r + 2 * sbh / t + kv + 2 * sbf / t
    if not selective:
        floats += a * s * s * b / t
    return floats, 0.0, 2 * sbh / t - kv + 2 * s * rotary_features(shape)


def layer_matmuls(shape, tp: int) -> list[tuple[str, int, int]]:
    """One layer's weight matmuls on one TP rank as ``(name, in, out)`` in forward order (``tpsim.plan.kernels``):
    q, k, v h → (a/t + 2·k_t)·d, o_proj a·d/t → h, up h → F/t, down F/t → h."""
    h, d, f = shape.hidden, shape.head_dim, shape.ffn
    return [("qkv", h, (shape.heads // tp + 2 * kv_heads_per_rank(shape, tp)) * d), ("proj", shape.heads * d // tp, h),
            ("fc1", h, f // tp), ("fc2", f // tp, h)]


def layer_passes(shape, tokens: int, tp: int, sp: bool, e: int) -> list[tuple[str, float, int]]:
    """One layer's memory-bound forward passes as ``(name, bytes, slot)`` (slots as the Llama's): LayerNorm1P
    (read, write), RoPE on q and k (read, write: the turned features and the copied rest), the residual add,
    LayerNorm1P, relu² (read up's output, write), the residual add; the norm regions hold tokens/t rows
    under SP."""
    rows = tokens * shape.hidden / (tp if sp else 1)
    rope = 2 * e * (shape.heads // tp + kv_heads_per_rank(shape, tp)) * shape.head_dim * tokens
    return [("norm", 2 * e * rows, 0), ("rope", rope, 1), ("residual", 3 * e * rows, 3), ("norm", 2 * e * rows, 3),
            ("relu2", 2 * e * tokens * shape.ffn / tp, 4), ("residual", 3 * e * rows, 5)]
