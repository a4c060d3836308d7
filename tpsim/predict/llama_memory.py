"""Memory per rank of the Llama (``tpsim.models.llama``): parameters and cached activations, as formulas.

The terms ``tpsim.arch`` reaches for the ``llama`` entry (the four every architecture's module has), pure
arithmetic (no MPI). With b the local
batch, s the sequence, h hidden, a query heads, k KV heads, d = h / a, F the intermediate size, t the TP size,
k_t = max(k / t, 1) the KV heads a rank holds (1 when a KV head is replicated on t / k ranks) and r the split
of the norm regions (1 under TP, t under SP), elements per rank:

    parameters   embed_tokens and lm_head (Vp/t)·h each + L·(2h²/t + 2·h·d·k_t + 3hF/t + 2h) + h
    per block    floats (4bsh + 2bs)/r        the two RMSNorms' x̂ and rstd, their outputs fed to q/k/v, gate/up
                        + 4bsh/t              q and k after RoPE, v (both repeated to the rank's a/t heads:
                                              GQA saves no activation memory here, only KV weights and a cache),
                                              o_proj's input
                        + (a/t)·b·s²          attention probabilities
                        + 4bsF/t              gate, up, silu(gate) and the product fed to down_proj
                        + 2sd                 RoPE's cos and sin (the whole sequence)
    once         floats (bsh + bs)/r (norm x̂, rstd) + bsh/r (lm_head input) + b·s·n_real (the loss's softmax)
                 masks  2bs (owned ids, valid targets); Llama has no dropout

tests/mpi/test_llama_formulas.py measures them on live caches at TP 1, 2, 4, 8, with and without SP.

The planner (``paper_layer_elements``) counts a layer in Megatron's way (``tpsim.plan.memory``'s docstring):
4sbh/r (both norms' inputs and outputs) + 2sbh/t (q after RoPE, the context) + 2·s·b·d·k_t (k and v after RoPE)
+ 3sbF/t (gate, up, their product) + a·s²·b/t (softmax output; removed by selective recompute), and apart,
tpsim's own: k and v repeated to every local q head (2sbh/t − 2·s·b·d·k_t), SiLU's output beside the product
(sbF/t) and RoPE's cos/sin tables (2·s·d) — besides the norms' rstd, which the planner adds for every model.
"""

from __future__ import annotations

from tpsim.arch.shape import kv_heads_per_rank

ACTIVATION_SOURCE = "derived (Megatron's counting)"  # where the planner's activation count per layer comes from


def layer_param_elements(shape, tp: int) -> int:
    """Parameter elements of one decoder layer on one TP rank: q and o_proj (2·h·a·d/t), gate/up/down (3hF/t),
    k and v_proj of this rank's KV heads (2·h·d·k_t, replicated ones whole) and the two RMSNorm weights (2h)."""
    h, d, a, f = shape.hidden, shape.head_dim, shape.heads, shape.ffn
    return (2 * h * a * d + 3 * h * f) // tp + 2 * h * d * kv_heads_per_rank(shape, tp) + 2 * h


def layer_vector_elements(shape) -> int:
    """Parameters of one layer outside its matmuls: the two RMSNorm weights (no biases)."""
    return 2 * shape.hidden


def llama_block_activation_elements(config, tp: int, b: int, s: int, sequence_parallel: bool = False) -> int:
    """Float elements one decoder layer caches on one rank (see the module docstring); it holds no masks."""
    r = tp if sequence_parallel else 1
    if s % r:
        raise ValueError(f"sequence length {s} is not divisible by tp {tp} (sequence parallelism)")
    h, heads = config.hidden_size, config.num_attention_heads
    return ((4 * b * s * h + 2 * b * s) // r + 4 * b * s * h // tp + heads // tp * b * s * s
            + 4 * b * s * config.intermediate_size // tp + 2 * s * config.head_dim)


def activation_elements(config, tp: int, batch: int, seq: int, n_real: int, dropout: bool | None = None,
                        sequence_parallel: bool = False) -> dict[str, int]:
    """``{"floats", "masks"}`` the Llama's forward caches on one rank; ``n_real``: its real vocabulary columns;
    ``dropout`` is not used (Llama has none)."""
    block = llama_block_activation_elements(config, tp, batch, seq, sequence_parallel)
    return decoder_activation_elements(config, tp, batch, seq, n_real, block, sequence_parallel)


def decoder_activation_elements(config, tp: int, b: int, s: int, n_real: int, block: int,
                                sequence_parallel: bool = False) -> dict[str, int]:
    """``{"floats", "masks"}`` of a decoder on the Llama's wiring whose layer caches ``block`` floats: L layers,
    then the final norm's x̂ and rstd and the LM head's input ((2bsh + bs)/r), the loss's softmax (b·s·n_real),
    and the two index masks (2bs). The Nemotron's count uses it too."""
    h, r = config.hidden_size, tp if sequence_parallel else 1
    floats = config.num_hidden_layers * block + (2 * b * s * h + b * s) // r + b * s * n_real
    return {"floats": floats, "masks": 2 * b * s}


def paper_layer_elements(shape, b: int, s: int, t: int, sp: bool, selective: bool) -> tuple[float, float, float]:
    """``(floats, masks, tpsim's own floats)`` of one layer in Megatron's counting (the module docstring);
    ``selective`` recompute drops the softmax output. No dropout, so no masks."""
    h, a, r = shape.hidden, shape.heads, t if sp else 1
    sbh, sbf, hd = s * b * h, s * b * shape.ffn, shape.head_dim
    kv = 2 * s * b * hd * kv_heads_per_rank(shape, t)  # k and v after RoPE, this rank's KV heads
    floats = 4 * sbh / r + 2 * sbh / t + kv + 3 * sbf / t
    if not selective:
        floats += a * s * s * b / t
    # tpsim's Llama layers also keep: k and v repeated to every local q head, SiLU's output beside the product,
    # RoPE's cos and sin tables [s, hd]
    return floats, 0.0, 2 * sbh / t - kv + sbf / t + 2 * s * hd


ATTENTION_DROPOUT = False  # Llama has no dropout


def layer_matmuls(shape, tp: int) -> list[tuple[str, int, int]]:
    """One layer's weight matmuls on one TP rank as ``(name, in, out)`` in forward order (``tpsim.plan.kernels``):
    q, k, v h → (a/t + 2·k_t)·d (k_t this rank's KV heads), o_proj a·d/t → h, gate | up h → 2F/t, down F/t → h."""
    h, d, f = shape.hidden, shape.head_dim, shape.ffn
    return [("qkv", h, (shape.heads // tp + 2 * kv_heads_per_rank(shape, tp)) * d), ("proj", shape.heads * d // tp, h),
            ("gate_up", h, 2 * f // tp), ("down", f // tp, h)]


def layer_passes(shape, tokens: int, tp: int, sp: bool, e: int) -> list[tuple[str, float, int]]:
    """One layer's memory-bound forward passes as ``(name, bytes, slot)`` in forward order, scores apart (slot as
    in ``tpsim.predict.gpt_memory.layer_passes``): RMSNorm (read,
    write), RoPE on q and k (read, write), the residual add (read two, write one), RMSNorm, SwiGLU (read gate and
    up, write their product); the norm regions hold tokens/t rows under SP."""
    rows = tokens * shape.hidden / (tp if sp else 1)
    rope = 2 * e * (shape.heads // tp + kv_heads_per_rank(shape, tp)) * shape.head_dim * tokens
    return [("norm", 2 * e * rows, 0), ("rope", rope, 1), ("residual", 3 * e * rows, 3), ("norm", 2 * e * rows, 3),
            ("swiglu", 3 * e * tokens * shape.ffn / tp, 4), ("residual", 3 * e * rows, 5)]
