"""Mixtral as Hugging Face writes it (``MixtralConfig``, ``MixtralForCausalLM``): its config.json keys and the
names of its tensors in files.

    config.json   the Llama's keys (``tpsim.arch.llama_hf``), num_local_experts, num_experts_per_tok,
                  router_aux_loss_coef; router_jitter_noise must be 0 and sliding_window null (tpsim models
                  neither)
    tensors       the Llama's names but each MLP is ``block_sparse_moe.{gate, experts.{e}.{w1, w2, w3}}`` in
                  files (w1 the gate projection, w3 the up, w2 the down: the paper's names); tpsim names them
                  as transformers 5 does in memory, ``mlp.gate`` and ``mlp.experts.{e}.{gate,up,down}_proj``.
                  Every linear, the router's gate too, is transposed between [out, in] and tpsim's [in, out].
"""

from __future__ import annotations

import re

import numpy as np

from tpsim.arch.hf_keys import check_flags, refuse
from tpsim.arch.llama_hf import llama_fields, planner_sizes  # noqa: F401  (the sizes the planner reads: the same)
from tpsim.arch.mixtral import MixtralConfig

MODEL_TYPE = "mixtral"
_FILE = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}
_MINE = {v: k for k, v in _FILE.items()}


def read_config(cfg: dict, where: str = "config.json") -> MixtralConfig:
    """A ``MixtralConfig`` from a Mixtral config.json (``HFConfigError`` for what tpsim does not model)."""
    fields = llama_fields({**cfg, "attention_bias": False, "mlp_bias": False}, where)
    if float(cfg.get("router_jitter_noise") or 0.0):
        refuse(where, "router_jitter_noise", cfg["router_jitter_noise"], "tpsim's router adds no noise")
    check_flags(cfg, where, {"sliding_window": None}, {"sliding_window": "tpsim's attention is full causal"})
    return MixtralConfig(**fields, num_local_experts=int(cfg.get("num_local_experts", 8)),
                         num_experts_per_tok=int(cfg.get("num_experts_per_tok", 2)),
                         router_aux_loss_coef=float(cfg.get("router_aux_loss_coef", 0.001))).check(1)


def transposed(name: str) -> bool:
    """Every linear: ``*_proj.weight`` and the router's ``mlp.gate.weight`` (tpsim's names)."""
    return name.endswith("_proj.weight") or name.endswith(".mlp.gate.weight")


def canonical_names(tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Files' names -> tpsim's: ``block_sparse_moe.gate`` -> ``mlp.gate``, ``experts.{e}.w1`` -> ``gate_proj``."""
    out = {}
    for name, value in tensors.items():
        name = name.replace(".block_sparse_moe.", ".mlp.")
        m = re.search(r"\.experts\.(\d+)\.(w[123])\.weight$", name)
        if m:
            name = name[:m.start(2)] + _FILE[m.group(2)] + ".weight"
        out[name] = value
    return out


def file_names(tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """tpsim's names -> the files' (the inverse of ``canonical_names``)."""
    out = {}
    for name, value in tensors.items():
        m = re.search(r"\.mlp\.(gate\.weight|experts\.\d+\.(gate|up|down)_proj\.weight)$", name)
        if m:
            name = name.replace(".mlp.", ".block_sparse_moe.")
            if m.group(2):
                name = name[:name.rindex(m.group(2))] + _MINE[m.group(2) + "_proj"] + ".weight"
        out[name] = value
    return out
