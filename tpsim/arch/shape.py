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

from tpsim.errors import ConfigError


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


class DecoderShape:
    """The shared shape read off Hugging Face's decoder field names (``hidden_size``, ``num_attention_heads``,
    ``num_key_value_heads``, ``intermediate_size``, ``num_hidden_layers``, ``vocab_size``,
    ``max_position_embeddings``): Llama's and Nemotron's configs mix it in."""

    head_dim = property(lambda self: self.hidden_size // self.num_attention_heads)
    hidden = property(lambda self: self.hidden_size)
    heads = property(lambda self: self.num_attention_heads)
    kv_heads = property(lambda self: self.num_key_value_heads)
    ffn = property(lambda self: self.intermediate_size)
    layers = property(lambda self: self.num_hidden_layers)
    vocab = property(lambda self: self.vocab_size)
    max_positions = property(lambda self: self.max_position_embeddings)

    def check_decoder(self, tp: int, ffn_split: str) -> None:
        """Raise ``ConfigError`` naming the first size rule broken at TP size ``tp``: every size ≥ 1, heads
        dividing hidden, an even head_dim (RoPE turns pairs), KV heads dividing the query heads, heads by tp, KV
        heads split or replicated, the MLP's width by tp (``ffn_split`` says which of its matrices are cut)."""
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                     "num_key_value_heads", "max_position_embeddings"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        h, heads, kv = self.hidden_size, self.num_attention_heads, self.num_key_value_heads
        if h % heads:
            raise ConfigError(f"hidden_size {h} is not divisible by num_attention_heads {heads}")
        if self.head_dim % 2:
            raise ConfigError(f"head_dim = hidden_size / heads = {self.head_dim} must be even (RoPE rotates pairs)")
        if heads % kv:
            raise ConfigError(f"num_attention_heads {heads} is not a multiple of num_key_value_heads {kv}")
        if heads % tp:
            raise ConfigError(f"num_attention_heads {heads} is not divisible by tp {tp} (attention is split by heads)")
        if kv % tp and tp % kv:
            raise ConfigError(f"num_key_value_heads {kv} and tp {tp}: neither divides the other, so the ranks' "
                              f"query heads would read overlapping, uneven sets of KV heads (KV heads are split "
                              f"when kv % tp == 0 and replicated on tp / kv ranks when tp % kv == 0)")
        if self.intermediate_size % tp:
            raise ConfigError(f"intermediate_size {self.intermediate_size} is not divisible by tp {tp} "
                              f"({ffn_split} split by columns)")

    def describe_decoder(self, name: str, tp: int) -> str:
        """The model in one line, as the demo's header shows it at tensor-parallel size ``tp``."""
        kv, rep = self.num_key_value_heads, kv_replicas(self, tp)
        kv_text = f"{kv_heads_per_rank(self, tp)} per TP rank" + (f", each replicated on {rep} ranks" if rep > 1
                                                                   else "")
        return (f"{name}: {self.num_hidden_layers} layers, hidden {self.hidden_size}, "
                f"{self.num_attention_heads} heads ({self.num_attention_heads // tp} per TP rank), "
                f"{kv} KV heads ({kv_text}), ffn {self.intermediate_size}")
