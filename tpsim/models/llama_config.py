"""The Llama's shape, in Hugging Face ``LlamaConfig`` terms (Touvron et al. 2023), and the checks TP puts on it.

    vocab_size V, hidden_size h, intermediate_size ffn, num_hidden_layers, num_attention_heads,
    num_key_value_heads (grouped-query attention, Ainslie et al. 2023, arXiv:2305.13245),
    max_position_embeddings, rms_norm_eps, rope_theta; pre-norm blocks with RMSNorm, SwiGLU MLP, RoPE,
    no biases, untied LM head, no dropout.

Pure arithmetic (no MPI), like ``tpsim.models.config``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from tpsim.errors import ConfigError


@dataclass(frozen=True)
class LlamaConfig:
    vocab_size: int = 64
    hidden_size: int = 64
    intermediate_size: int = 128
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    max_position_embeddings: int = 32
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    initializer_range: float = 0.02

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def check(self, tp: int = 1) -> "LlamaConfig":
        """Raise ``ConfigError`` naming the first constraint this config breaks at tensor-parallel size ``tp``."""
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
            raise ConfigError(f"num_key_value_heads {kv} and tp {tp}: neither divides the other, so some rank "
                              f"would need part of a KV head (KV heads are split when kv % tp == 0 and "
                              f"replicated on tp / kv ranks when tp % kv == 0)")
        if self.intermediate_size % tp:
            raise ConfigError(f"intermediate_size {self.intermediate_size} is not divisible by tp {tp} "
                              f"(gate/up are split by columns)")
        return self

    def hf_config(self) -> dict:
        """The keys of Hugging Face's LlamaConfig that describe this model (``LlamaConfig(**this)`` loads it)."""
        return {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": self.vocab_size,
                "hidden_size": self.hidden_size, "intermediate_size": self.intermediate_size,
                "num_hidden_layers": self.num_hidden_layers, "num_attention_heads": self.num_attention_heads,
                "num_key_value_heads": self.num_key_value_heads,
                "max_position_embeddings": self.max_position_embeddings, "rms_norm_eps": self.rms_norm_eps,
                "rope_theta": self.rope_theta, "hidden_act": "silu", "tie_word_embeddings": False,
                "attention_bias": False, "mlp_bias": False, "attention_dropout": 0.0,
                "initializer_range": self.initializer_range}

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        """Full (unsharded, unpadded) shape of every parameter by its Hugging Face name, in tpsim's layout.

        tpsim's ``Linear`` stores ``[in, out]`` (torch's ``nn.Linear`` is ``[out, in]``: transpose for files);
        the embedding and the untied ``lm_head`` are ``[V, h]`` in both.
        """
        h, V, ffn, hd = self.hidden_size, self.vocab_size, self.intermediate_size, self.head_dim
        q, kv = self.num_attention_heads * hd, self.num_key_value_heads * hd
        shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (V, h)}
        for i in range(self.num_hidden_layers):
            p = f"model.layers.{i}"
            shapes.update({f"{p}.input_layernorm.weight": (h,),
                           f"{p}.self_attn.q_proj.weight": (h, q), f"{p}.self_attn.k_proj.weight": (h, kv),
                           f"{p}.self_attn.v_proj.weight": (h, kv), f"{p}.self_attn.o_proj.weight": (q, h),
                           f"{p}.post_attention_layernorm.weight": (h,),
                           f"{p}.mlp.gate_proj.weight": (h, ffn), f"{p}.mlp.up_proj.weight": (h, ffn),
                           f"{p}.mlp.down_proj.weight": (ffn, h)})
        shapes.update({"model.norm.weight": (h,), "lm_head.weight": (V, h)})
        return shapes

    def as_dict(self) -> dict:
        return asdict(self)
