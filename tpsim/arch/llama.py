"""The Llama's shape, in Hugging Face ``LlamaConfig`` terms (Touvron et al. 2023), and the checks TP puts on it.

    vocab_size V, hidden_size h, intermediate_size ffn, num_hidden_layers, num_attention_heads,
    num_key_value_heads (grouped-query attention, Ainslie et al. 2023, arXiv:2305.13245),
    max_position_embeddings, rms_norm_eps, rope_theta; pre-norm blocks with RMSNorm, SwiGLU MLP, RoPE,
    no biases, untied LM head, no dropout.

Pure arithmetic (no MPI), like ``tpsim.arch.gpt2``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import ClassVar

from tpsim.arch.shape import DecoderShape, LayerNames
from tpsim.errors import ConfigError


@dataclass(frozen=True)
class LlamaConfig(DecoderShape):
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

    # --- the shape every architecture's config exposes (tpsim.arch): one spelling for code that serves both ---
    arch: ClassVar[str] = "llama"
    norm: ClassVar[str] = "rmsnorm"  # a weight, no bias
    activation: ClassVar[str] = "swiglu"  # gate, up, down
    positions: ClassVar[str] = "rope"  # rotary: no position parameters
    tied: ClassVar[bool] = False  # lm_head is its own [V, h] matrix
    biases: ClassVar[bool] = False
    has_dropout: ClassVar[bool] = False  # Llama trains without dropout
    dropout: ClassVar[float] = 0.0  # Llama's attention and residual dropouts are 0 (GPTConfig's is a field)
    norm_params: ClassVar[int] = 1  # vectors of [h] per RMSNorm: its weight (its SP gradient sync: [h])
    layer_names: ClassVar[LayerNames] = LayerNames("model.embed_tokens", "model.norm", "model.layers", "self_attn",
                                                   "mlp", "input_layernorm", "post_attention_layernorm")
    position_table: ClassVar[str | None] = None  # RoPE: no position parameters
    size_choices: ClassVar[tuple[str, ...]] = ("kv_heads", "ffn")  # from_sizes's choices beyond the shared sizes
    manifest_keys: ClassVar[tuple[str, ...]] = ("vocab_size", "max_position_embeddings", "hidden_size",
                                                "intermediate_size", "num_hidden_layers", "num_attention_heads",
                                                "num_key_value_heads")

    @property
    def norm_eps(self) -> float:
        return self.rms_norm_eps

    @classmethod
    def from_sizes(cls, *, vocab: int, hidden: int, layers: int, heads: int, max_positions: int,
                   dropout: float = 0.0, kv_heads: int | None = None, ffn: int | None = None) -> "LlamaConfig":
        """The config from the sizes every architecture shares (the demo's flags). Defaults: 2 KV heads when
        ``heads`` is even (grouped-query attention shows; at TP 4 each is replicated on two ranks), else one per
        head; ``ffn`` 8h/3 rounded up to a multiple of 32 (the SwiGLU width that keeps the MLP's parameters
        near a 4h GeLU MLP's, as Llama does: 192 for h = 64). Llama has no dropout."""
        if dropout:
            raise ConfigError("--arch llama has no dropout (Llama's attention and residual dropouts are 0)")
        kv_heads = (2 if heads % 2 == 0 else heads) if kv_heads is None else kv_heads
        ffn = -(-8 * hidden // 3 // 32) * 32 if ffn is None else ffn
        for flag, value in (("kv-heads", kv_heads), ("ffn", ffn)):
            if value < 1:
                raise ConfigError(f"--{flag} must be >= 1, got {value}")
        return cls(vocab_size=vocab, hidden_size=hidden, intermediate_size=ffn, num_hidden_layers=layers,
                   num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=max_positions)

    def check(self, tp: int = 1) -> "LlamaConfig":
        """Raise ``ConfigError`` naming the first constraint this config breaks at tensor-parallel size ``tp``."""
        self.check_decoder(tp, "gate/up are")
        return self

    def describe(self, tp: int) -> str:
        """The model in one line, as the demo's header shows it at tensor-parallel size ``tp``."""
        return self.describe_decoder("Llama", tp)

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
