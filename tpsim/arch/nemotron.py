"""Nemotron-4's shape (Parmar et al. 2024, arXiv:2402.16819; Hugging Face ``NemotronConfig``) and the checks TP
puts on it.

    vocab_size V, hidden_size h, intermediate_size F, num_hidden_layers, num_attention_heads,
    num_key_value_heads (grouped-query attention), max_position_embeddings, norm_eps, rope_theta,
    partial_rotary_factor (RoPE on the first factor · head_dim features of each head: 0.5); pre-norm blocks with
    LayerNorm1P (LayerNorm whose scale is 1 + weight, with a bias), a squared-ReLU MLP without a gate
    (up_proj, down_proj), no biases in the linears, an untied LM head, no dropout.

What differs from the Llama is the norm (two vectors of [h] a norm, not one), the MLP (two matrices, F = 4h by
default, not SwiGLU's three at 8h/3) and the partial rotary; the attention and the wiring are the Llama's.
Pure arithmetic (no MPI), like ``tpsim.arch.llama``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import ClassVar

from tpsim.arch.shape import DecoderShape, LayerNames
from tpsim.errors import ConfigError


@dataclass(frozen=True)
class NemotronConfig(DecoderShape):
    vocab_size: int = 64
    hidden_size: int = 64
    intermediate_size: int = 256
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    max_position_embeddings: int = 32
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    partial_rotary_factor: float = 0.5
    initializer_range: float = 0.0134  # Hugging Face's NemotronConfig default

    # --- the shape every architecture's config exposes (tpsim.arch) ---
    arch: ClassVar[str] = "nemotron"
    norm: ClassVar[str] = "layernorm1p"  # a weight (the scale is 1 + weight) and a bias
    activation: ClassVar[str] = "relu2"  # up, relu², down: no gate
    positions: ClassVar[str] = "rope"  # partial rotary: no position parameters
    tied: ClassVar[bool] = False
    biases: ClassVar[bool] = False  # the linears have none (the norms have theirs)
    has_dropout: ClassVar[bool] = False
    dropout: ClassVar[float] = 0.0
    norm_params: ClassVar[int] = 2  # vectors of [h] per LayerNorm1P: weight and bias (their SP sync: [2, h])
    layer_names: ClassVar[LayerNames] = LayerNames("model.embed_tokens", "model.norm", "model.layers", "self_attn",
                                                   "mlp", "input_layernorm", "post_attention_layernorm")
    position_table: ClassVar[str | None] = None
    size_choices: ClassVar[tuple[str, ...]] = ("kv_heads", "ffn")
    manifest_keys: ClassVar[tuple[str, ...]] = ("vocab_size", "max_position_embeddings", "hidden_size",
                                                "intermediate_size", "num_hidden_layers", "num_attention_heads",
                                                "num_key_value_heads")

    @property
    def rotary_dim(self) -> int:
        """Features of each head RoPE turns: ⌊partial_rotary_factor · head_dim⌋ (Hugging Face's rule)."""
        return int(self.partial_rotary_factor * self.head_dim)

    @classmethod
    def from_sizes(cls, *, vocab: int, hidden: int, layers: int, heads: int, max_positions: int,
                   dropout: float = 0.0, kv_heads: int | None = None, ffn: int | None = None) -> "NemotronConfig":
        """The config from the sizes every architecture shares (the demo's flags). Defaults: 2 KV heads when
        ``heads`` is even, else one per head (as the Llama's); ``ffn`` 4h (Nemotron-4's). No dropout."""
        if dropout:
            raise ConfigError("--arch nemotron has no dropout (Nemotron-4 trains without it)")
        kv_heads = (2 if heads % 2 == 0 else heads) if kv_heads is None else kv_heads
        ffn = 4 * hidden if ffn is None else ffn
        for flag, value in (("kv-heads", kv_heads), ("ffn", ffn)):
            if value < 1:
                raise ConfigError(f"--{flag} must be >= 1, got {value}")
        return cls(vocab_size=vocab, hidden_size=hidden, intermediate_size=ffn, num_hidden_layers=layers,
                   num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=max_positions)

    def check(self, tp: int = 1) -> "NemotronConfig":
        """Raise ``ConfigError`` naming the first constraint this config breaks at tensor-parallel size ``tp``."""
        self.check_decoder(tp, "up_proj is")
        if not 0 < self.partial_rotary_factor <= 1:
            raise ConfigError(f"partial_rotary_factor must be in (0, 1], got {self.partial_rotary_factor}")
        if self.rotary_dim < 2 or self.rotary_dim % 2:
            raise ConfigError(f"RoPE turns partial_rotary_factor x head_dim = {self.rotary_dim} features of each "
                              f"head: it must be even and at least 2 (head_dim {self.head_dim})")
        return self

    def describe(self, tp: int) -> str:
        """The model in one line, as the demo's header shows it at tensor-parallel size ``tp``."""
        return self.describe_decoder("Nemotron", tp) + f", RoPE on {self.rotary_dim} of {self.head_dim} features"

    def hf_config(self) -> dict:
        """The keys of Hugging Face's NemotronConfig that describe this model."""
        return {"model_type": "nemotron", "architectures": ["NemotronForCausalLM"], "vocab_size": self.vocab_size,
                "hidden_size": self.hidden_size, "intermediate_size": self.intermediate_size,
                "num_hidden_layers": self.num_hidden_layers, "num_attention_heads": self.num_attention_heads,
                "num_key_value_heads": self.num_key_value_heads, "head_dim": self.head_dim,
                "max_position_embeddings": self.max_position_embeddings, "norm_eps": self.norm_eps,
                "rope_theta": self.rope_theta, "partial_rotary_factor": self.partial_rotary_factor,
                "hidden_act": "relu2", "tie_word_embeddings": False, "attention_bias": False, "mlp_bias": False,
                "attention_dropout": 0.0, "initializer_range": self.initializer_range}

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        """Full (unsharded, unpadded) shape of every parameter by its Hugging Face name, in tpsim's layout
        (linears ``[in, out]``: transposed for files; the embedding and ``lm_head`` ``[V, h]`` in both)."""
        h, V, ffn, hd = self.hidden_size, self.vocab_size, self.intermediate_size, self.head_dim
        q, kv = self.num_attention_heads * hd, self.num_key_value_heads * hd
        shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (V, h)}
        for i in range(self.num_hidden_layers):
            p = f"model.layers.{i}"
            shapes.update({f"{p}.input_layernorm.weight": (h,), f"{p}.input_layernorm.bias": (h,),
                           f"{p}.self_attn.q_proj.weight": (h, q), f"{p}.self_attn.k_proj.weight": (h, kv),
                           f"{p}.self_attn.v_proj.weight": (h, kv), f"{p}.self_attn.o_proj.weight": (q, h),
                           f"{p}.post_attention_layernorm.weight": (h,), f"{p}.post_attention_layernorm.bias": (h,),
                           f"{p}.mlp.up_proj.weight": (h, ffn), f"{p}.mlp.down_proj.weight": (ffn, h)})
        shapes.update({"model.norm.weight": (h,), "model.norm.bias": (h,), "lm_head.weight": (V, h)})
        return shapes

    def as_dict(self) -> dict:
        return asdict(self)
