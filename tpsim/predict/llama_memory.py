"""Memory per rank of the Llama (``tpsim.models.llama``): parameters and cached activations, as formulas.

Pure arithmetic (no MPI); ``tpsim.predict.memory`` dispatches here for a ``LlamaConfig``. With b the local
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
"""

from __future__ import annotations

from tpsim.partition import padded_vocab_size


def is_llama(config) -> bool:
    """A ``LlamaConfig`` (Hugging Face field names) rather than a ``GPTConfig``."""
    return hasattr(config, "num_key_value_heads")


def local_kv_heads(config, tp: int) -> int:
    """KV heads one TP rank holds: kv / tp when they split, 1 when each is replicated on tp / kv ranks."""
    return max(config.num_key_value_heads // tp, 1)


def llama_param_elements(config, tp: int) -> int:
    """Parameter elements one TP rank holds (its shards, replicated KV heads and the RMSNorm weights)."""
    h, d, ffn = config.hidden_size, config.head_dim, config.intermediate_size
    block = 2 * h * h // tp + 2 * h * d * local_kv_heads(config, tp) + 3 * h * ffn // tp + 2 * h
    vocab = padded_vocab_size(config.vocab_size, tp) // tp * h
    return 2 * vocab + config.num_hidden_layers * block + h


def llama_block_activation_elements(config, tp: int, b: int, s: int, sequence_parallel: bool = False) -> int:
    """Float elements one decoder layer caches on one rank (see the module docstring); it holds no masks."""
    r = tp if sequence_parallel else 1
    if s % r:
        raise ValueError(f"sequence length {s} is not divisible by tp {tp} (sequence parallelism)")
    h, heads = config.hidden_size, config.num_attention_heads
    return ((4 * b * s * h + 2 * b * s) // r + 4 * b * s * h // tp + heads // tp * b * s * s
            + 4 * b * s * config.intermediate_size // tp + 2 * s * config.head_dim)


def llama_activation_elements(config, tp: int, batch: int, seq: int, n_real: int,
                              sequence_parallel: bool = False) -> dict[str, int]:
    """``{"floats", "masks"}`` the Llama's forward caches on one rank; ``n_real``: its real vocabulary columns."""
    b, s, h = batch, seq, config.hidden_size
    r = tp if sequence_parallel else 1
    block = llama_block_activation_elements(config, tp, b, s, sequence_parallel)
    floats = config.num_hidden_layers * block + (2 * b * s * h + b * s) // r + b * s * n_real
    return {"floats": floats, "masks": 2 * b * s}
