"""The GPT's shape, in Hugging Face ``GPT2Config`` terms, and the checks TP puts on it.

    vocab_size V, n_positions (max sequence), n_embd h, n_layer, n_head; pre-LN blocks, GeLU tanh
    ("gelu_new"), LayerNorm eps 1e-5, LM head tied to the token embedding; one dropout p for the embedding,
    residual and attention-probability dropouts (GPT-2's embd_pdrop = resid_pdrop = attn_pdrop).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import ClassVar

from tpsim.arch.shape import LayerNames
from tpsim.errors import ConfigError


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int = 64
    n_positions: int = 32
    n_embd: int = 64
    n_layer: int = 2
    n_head: int = 4
    dropout: float = 0.0
    layer_norm_epsilon: float = 1e-5
    initializer_range: float = 0.02

    # --- the shape every architecture's config exposes (tpsim.arch): one spelling for code that serves both ---
    arch: ClassVar[str] = "gpt2"
    norm: ClassVar[str] = "layernorm"  # with a bias
    activation: ClassVar[str] = "gelu_tanh"  # a 4h GeLU MLP ("gelu_new")
    positions: ClassVar[str] = "learned"  # wpe, [n_positions, h]
    tied: ClassVar[bool] = True  # the LM head is the token embedding
    biases: ClassVar[bool] = True
    has_dropout: ClassVar[bool] = True  # embedding, residual and attention-probability dropout, one p
    norm_params: ClassVar[int] = 2  # vectors of [h] per LayerNorm: weight and bias (its SP gradient sync: [2, h])
    layer_names: ClassVar[LayerNames] = LayerNames("transformer.wte", "transformer.ln_f", "transformer.h", "attn",
                                                   "mlp", "ln_1", "ln_2")
    position_table: ClassVar[str | None] = "transformer.wpe.weight"  # the learned [n_positions, h] table
    size_choices: ClassVar[tuple[str, ...]] = ()  # sizes beyond the shared ones: none (kv = heads, ffn = 4h)
    manifest_keys: ClassVar[tuple[str, ...]] = ("vocab_size", "n_positions", "n_embd", "n_layer", "n_head")

    @property
    def hidden(self) -> int:
        return self.n_embd

    @property
    def heads(self) -> int:
        return self.n_head

    @property
    def kv_heads(self) -> int:
        return self.n_head  # multi-head attention: every query head has its own key/value head

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def ffn(self) -> int:
        return 4 * self.n_embd

    @property
    def layers(self) -> int:
        return self.n_layer

    @property
    def vocab(self) -> int:
        return self.vocab_size

    @property
    def max_positions(self) -> int:
        return self.n_positions

    @property
    def norm_eps(self) -> float:
        return self.layer_norm_epsilon

    @classmethod
    def from_sizes(cls, *, vocab: int, hidden: int, layers: int, heads: int, max_positions: int,
                   dropout: float = 0.0, kv_heads: int | None = None, ffn: int | None = None) -> "GPTConfig":
        """The config from the sizes every architecture shares (the demo's flags); GPT-2 has no choice of KV
        heads (multi-head attention) or MLP width (4h), so giving either is an error."""
        for flag, value in (("kv-heads", kv_heads), ("ffn", ffn)):
            if value is not None:
                raise ConfigError(f"--{flag} is for --arch llama")
        return cls(vocab_size=vocab, n_positions=max_positions, n_embd=hidden, n_layer=layers, n_head=heads,
                   dropout=dropout)

    def check(self, tp: int = 1) -> "GPTConfig":
        """Raise ``ConfigError`` naming the first constraint this config breaks at tensor-parallel size ``tp``."""
        for name in ("vocab_size", "n_positions", "n_embd", "n_layer", "n_head"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.n_embd % self.n_head:
            raise ConfigError(f"hidden size {self.n_embd} is not divisible by heads {self.n_head}")
        if self.n_head % tp:
            raise ConfigError(f"heads {self.n_head} is not divisible by tp {tp} (attention is split by heads)")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"dropout must be in [0, 1), got {self.dropout}")
        return self

    def describe(self, tp: int) -> str:
        """The model in one line, as the demo's header shows it at tensor-parallel size ``tp``."""
        return (f"GPT: {self.n_layer} layers, hidden {self.n_embd}, {self.n_head} heads "
                f"({self.n_head // tp} per TP rank)")

    def hf_config(self) -> dict:
        """The keys of Hugging Face's GPT2Config that describe this model."""
        return {"model_type": "gpt2", "vocab_size": self.vocab_size, "n_positions": self.n_positions,
                "n_embd": self.n_embd, "n_layer": self.n_layer, "n_head": self.n_head,
                "activation_function": "gelu_new", "layer_norm_epsilon": self.layer_norm_epsilon,
                "tie_word_embeddings": True, "embd_pdrop": self.dropout, "resid_pdrop": self.dropout,
                "attn_pdrop": self.dropout, "initializer_range": self.initializer_range}

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        """Full (unsharded, unpadded) shape of every parameter, by its GPT-2 name."""
        h, V = self.n_embd, self.vocab_size
        shapes = {"transformer.wte.weight": (V, h), "transformer.wpe.weight": (self.n_positions, h)}
        for i in range(self.n_layer):
            p = f"transformer.h.{i}"
            shapes.update({f"{p}.ln_1.weight": (h,), f"{p}.ln_1.bias": (h,),
                           f"{p}.attn.c_attn.weight": (h, 3 * h), f"{p}.attn.c_attn.bias": (3 * h,),
                           f"{p}.attn.c_proj.weight": (h, h), f"{p}.attn.c_proj.bias": (h,),
                           f"{p}.ln_2.weight": (h,), f"{p}.ln_2.bias": (h,),
                           f"{p}.mlp.c_fc.weight": (h, 4 * h), f"{p}.mlp.c_fc.bias": (4 * h,),
                           f"{p}.mlp.c_proj.weight": (4 * h, h), f"{p}.mlp.c_proj.bias": (h,)})
        shapes.update({"transformer.ln_f.weight": (h,), "transformer.ln_f.bias": (h,)})
        return shapes

    def as_dict(self) -> dict:
        return asdict(self)
