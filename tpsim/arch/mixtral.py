"""Mixtral's shape (Jiang et al. 2024, "Mixtral of Experts"), in Hugging Face ``MixtralConfig`` terms: a Llama
whose every MLP is a sparse mixture of experts — and the MoE knobs tpsim adds to it.

    the Llama's fields (``tpsim.arch.llama``), intermediate_size F being each expert's width;
    num_local_experts E, num_experts_per_tok k, router_aux_loss_coef α (Hugging Face's; its model adds α·L_aux
    only when output_router_logits is on: tpsim always trains with it)

tpsim's knobs beyond Mixtral's file (a run that sets one cannot be written as a Mixtral ``config.json``):
router (``softmax`` Mixtral's renormalised, ``sigmoid`` DeepSeek-V3's with a selection bias), router_z_loss_coef
β, capacity_factor (None: dropless), shared_experts (always-on SwiGLUs of shared_expert_intermediate_size),
first_dense_layers (DeepSeek's ``first_k_dense_replace``: that many leading layers keep a dense SwiGLU of
width F).

Pure arithmetic (no MPI), like ``tpsim.arch.llama``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

from tpsim.arch.llama import LlamaConfig
from tpsim.errors import ConfigError

ROUTER_KINDS = ("softmax", "sigmoid")  # the --router choices: Mixtral's and DeepSeek-V3's


@dataclass(frozen=True)
class MixtralConfig(LlamaConfig):
    num_local_experts: int = 8
    num_experts_per_tok: int = 2
    router_aux_loss_coef: float = 0.01
    router: str = "softmax"
    router_z_loss_coef: float = 0.0
    capacity_factor: float | None = None
    shared_experts: int = 0
    shared_expert_intermediate_size: int | None = None
    first_dense_layers: int = 0

    arch: ClassVar[str] = "mixtral"
    size_choices: ClassVar[tuple[str, ...]] = ("kv_heads", "ffn")
    flag_sizes: ClassVar[tuple[str, ...]] = ("experts", "top_k")  # what a folder's model must match, as flags
    manifest_keys: ClassVar[tuple[str, ...]] = LlamaConfig.manifest_keys + ("num_local_experts",
                                                                            "num_experts_per_tok")

    @property
    def experts(self) -> int:
        return self.num_local_experts

    @property
    def top_k(self) -> int:
        return self.num_experts_per_tok

    @property
    def shared_ffn(self) -> int:
        return self.shared_expert_intermediate_size or self.intermediate_size

    def moe_layer(self, i: int) -> bool:
        """Is layer ``i`` a mixture of experts (else a dense SwiGLU)?"""
        return i >= self.first_dense_layers

    def with_experts(self, **knobs) -> "MixtralConfig":
        """This config with the MoE knobs given (the demo's --experts, --top-k, ... flags; None: keep)."""
        return replace(self, **{k: v for k, v in knobs.items() if v is not None}).check(1)

    def check(self, tp: int = 1) -> "MixtralConfig":
        """``ConfigError`` naming the first constraint broken: the Llama's, then the experts'."""
        super().check(tp)
        E, k = self.num_local_experts, self.num_experts_per_tok
        if E < 1:
            raise ConfigError(f"--experts must be >= 1, got {E}")
        if not 0 < k <= E:
            raise ConfigError(f"--top-k {k} must be in 1 .. experts ({E})")
        if self.router not in ROUTER_KINDS:
            raise ConfigError(f"--router {self.router!r}: one of {', '.join(ROUTER_KINDS)}")
        if self.router == "sigmoid" and self.router_aux_loss_coef:
            raise ConfigError("--router sigmoid balances by its selection bias, not an aux loss: set --aux-loss-coef 0")
        if self.capacity_factor is not None and not self.capacity_factor > 0:
            raise ConfigError(f"--capacity-factor {self.capacity_factor} must be > 0 (leave it out: dropless)")
        for flag, value in (("aux-loss-coef", self.router_aux_loss_coef), ("z-loss-coef", self.router_z_loss_coef),
                            ("shared-experts", self.shared_experts), ("dense-layers", self.first_dense_layers)):
            if value < 0:
                raise ConfigError(f"--{flag} must be >= 0, got {value}")
        if self.first_dense_layers >= self.num_hidden_layers:
            raise ConfigError(f"--dense-layers {self.first_dense_layers} leaves no MoE layer of "
                              f"{self.num_hidden_layers}")
        if self.shared_experts and self.shared_ffn % tp:
            raise ConfigError(f"the shared experts' width {self.shared_ffn} is not divisible by tp {tp}")
        return self

    def describe(self, tp: int) -> str:
        shared = f", {self.shared_experts} shared" if self.shared_experts else ""
        dense = f", first {self.first_dense_layers} dense" if self.first_dense_layers else ""
        cap = "dropless" if self.capacity_factor is None else f"capacity factor {self.capacity_factor}"
        return (self.describe_decoder("Mixtral", tp).replace(", ffn ", ", expert ffn ")
                + f"; {self.num_local_experts} experts, top {self.num_experts_per_tok}{shared}{dense}, "
                f"{self.router} router, {cap}")

    def tpsim_only(self) -> list[str]:
        """The knobs set here that Mixtral's config.json cannot say (an export refuses them)."""
        out = []
        if self.router != "softmax":
            out.append(f"router {self.router}")
        for name, default in (("router_z_loss_coef", 0.0), ("capacity_factor", None), ("shared_experts", 0),
                              ("first_dense_layers", 0)):
            if getattr(self, name) != default:
                out.append(f"{name} {getattr(self, name)}")
        return out

    def hf_config(self) -> dict:
        """The keys of Hugging Face's MixtralConfig that describe this model."""
        out = super().hf_config()
        for key in ("attention_bias", "mlp_bias"):
            out.pop(key)
        out.update({"model_type": "mixtral", "architectures": ["MixtralForCausalLM"],
                    "num_local_experts": self.num_local_experts, "num_experts_per_tok": self.num_experts_per_tok,
                    "router_aux_loss_coef": self.router_aux_loss_coef, "output_router_logits": False,
                    "router_jitter_noise": 0.0, "sliding_window": None})
        return out

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every parameter's full shape by tpsim's name, in tpsim's layout ([in, out]): a MoE layer's
        ``mlp.gate`` (the router, [h, E]), ``mlp.experts.{e}.{gate,up,down}_proj`` and the shared experts'
        ``mlp.shared_experts.{j}.*`` (Mixtral's files name them otherwise: ``tpsim.arch.mixtral_hf``)."""
        h, F, S = self.hidden_size, self.intermediate_size, self.shared_ffn
        shapes = {}
        for name, shape in super().param_shapes().items():
            if ".mlp." not in name:
                shapes[name] = shape
                continue
            i = int(name.split(".")[2])
            if not self.moe_layer(i):
                shapes[name] = shape
            elif name.endswith("gate_proj.weight"):  # once per layer: the router, the experts, the shared ones
                p = f"model.layers.{i}.mlp"
                shapes[f"{p}.gate.weight"] = (h, self.num_local_experts)
                for e in range(self.num_local_experts):
                    shapes.update(swiglu_shapes(f"{p}.experts.{e}", h, F))
                for j in range(self.shared_experts):
                    shapes.update(swiglu_shapes(f"{p}.shared_experts.{j}", h, S))
        return shapes


def swiglu_shapes(prefix: str, h: int, ffn: int) -> dict[str, tuple[int, int]]:
    return {f"{prefix}.gate_proj.weight": (h, ffn), f"{prefix}.up_proj.weight": (h, ffn),
            f"{prefix}.down_proj.weight": (ffn, h)}
