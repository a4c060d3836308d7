"""The shape every architecture's config exposes, and the arithmetic TP does on it once for all of them.

    hidden h, heads a, kv_heads g (g = a: multi-head attention; g < a: grouped-query attention), head_dim d = h/a,
    ffn F, layers L, vocab V, max_positions, dropout, norm_eps; class constants arch, norm, activation,
    positions, tied, biases, layer_names (where the model's parts are traced), norm_params (vectors of [h] per
    norm: LayerNorm's weight and bias 2, RMSNorm's weight 1), position_table (the learned table's parameter
    name, None under RoPE), size_choices (the sizes ``from_sizes`` takes beyond the shared ones),
    manifest_keys (the sizes a checkpoint's manifest records); methods check(tp), describe(tp), hf_config(),
    param_shapes()

Attention is split by heads: a rank holds a/t query heads. KV heads are split the same way when t divides g,
and each is replicated on t/g ranks when g divides t (``config.check(tp)`` refuses the rest), so a rank holds
max(g/t, 1) of them (vLLM's rule for grouped-query attention; Megatron-LM requires t to divide g).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LayerNames:
    """Where a model's collectives are traced: its module names (GPT-2's, or Llama's; the same collectives)."""

    embed: str
    final_norm: str
    block: str  # prefix of block i: f"{block}.{i}"
    attn: str
    mlp: str
    norm_1: str  # before attention
    norm_2: str  # before the MLP


def kv_heads_per_rank(shape, tp: int) -> int:
    """KV heads one TP rank holds: g/t when t divides them, else 1 (replicated on t/g ranks)."""
    return max(shape.kv_heads // tp, 1)


def kv_replicas(shape, tp: int) -> int:
    """Ranks that hold the same KV head: t/g when t exceeds g, else 1 (every rank's KV heads are its own)."""
    return tp // shape.kv_heads if tp > shape.kv_heads else 1
