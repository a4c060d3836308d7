"""Mixtral (Jiang et al. 2024) on the Llama's wiring: serial and expert-parallel, Hugging Face names.

    x = embed_tokens(ids)                                               [b, s, h]
    for each layer:  x = x + self_attn(input_layernorm(x))              RMSNorm, GQA with RoPE
                     x = x + mlp(post_attention_layernorm(x))           RMSNorm, a mixture of E SwiGLU experts,
                                                                        top-k routed (``tpsim.nn.moe``), or a
                                                                        dense SwiGLU in the first dense layers
    logits = norm(x) · lm_headᵀ   (untied);  loss = mean cross-entropy — the language-model loss. The routers'
    auxiliary losses are added to the gradients inside each router's backward and reported apart, per layer
    (as Megatron-LM logs them).

The blocks, body and head are the Llama's (``tpsim.models.llama``); only the MLP differs. Module paths:
``model.layers.{i}.mlp.{gate, experts.{e}.{gate,up,down}_proj, shared_experts.{j}.*}`` (Mixtral's files say
``block_sparse_moe`` and w1/w3/w2: ``tpsim.arch.mixtral_hf``).

Parallel (``parallel_mixtral``): attention, norms, embedding and head exactly as the Llama's under TP (and SP),
each MoE layer an ``ExpertParallelMoE`` (``tpsim.ep``) on the grid's expert groups (Parallel Folding: ETP × EP ×
EDP over the same ranks), a dense layer a ``ParallelSwiGLU``.
"""

from __future__ import annotations

import copy

import numpy as np

from tpsim.arch.mixtral import MixtralConfig
from tpsim.comm import Group, ProcessGrid
from tpsim.ep.moe import ExpertParallelMoE
from tpsim.models.llama import LlamaDecoderLayer, LlamaForCausalLM, LlamaModel, shard_decoder
from tpsim.nn.attention import SERIAL_CORE, AttentionCore
from tpsim.nn.cross_entropy import CrossEntropyLoss
from tpsim.nn.embedding import Embedding
from tpsim.nn.gqa_attention import GQAttention
from tpsim.nn.lm_head import LMHead
from tpsim.nn.moe import MoE
from tpsim.nn.rmsnorm import RMSNorm
from tpsim.nn.swiglu import SwiGLU
from tpsim.tp.rmsnorm import SequenceParallelRMSNorm
from tpsim.tp.swiglu import ParallelSwiGLU


class MixtralForCausalLM(LlamaForCausalLM):
    """``model`` + untied ``lm_head`` + ``loss`` with MoE MLPs (the Llama's wiring and names)."""

    def moe_layers(self) -> list:
        """The mixture-of-experts layers, in layer order (serial ``MoE`` or ``ExpertParallelMoE``)."""
        return [m for _, m in self.named_modules() if isinstance(m, (MoE, ExpertParallelMoE))]


def moe_layer(config: MixtralConfig, rng: np.random.Generator, dtype) -> MoE:
    """One serial MoE layer of ``config`` (its draws: the router, the experts, the shared experts)."""
    return MoE(config.hidden_size, config.intermediate_size, config.num_local_experts, config.num_experts_per_tok,
               router=config.router, shared_experts=config.shared_experts, shared_ffn=config.shared_ffn,
               capacity_factor=config.capacity_factor, aux_coef=config.router_aux_loss_coef,
               z_coef=config.router_z_loss_coef, rng=rng, dtype=dtype, std=config.initializer_range)


def serial_mixtral(config: MixtralConfig, seed: int = 0, dtype=np.float64) -> MixtralForCausalLM:
    """The single-device model drawn from ``seed`` (N(0, initializer_range) for every linear, the router's gate
    and the embedding, ones for the RMSNorms), in a fixed order: the same model on every rank."""
    config.check(1)
    rng = np.random.default_rng(seed)
    std, h, eps = config.initializer_range, config.hidden_size, config.rms_norm_eps
    embed = Embedding(config.vocab_size, h, rng=rng, dtype=dtype, std=std)
    layers = []
    for i in range(config.num_hidden_layers):
        attn = GQAttention(h, config.num_attention_heads, config.num_key_value_heads, rope_theta=config.rope_theta,
                           rng=rng, dtype=dtype, std=std)
        mlp = moe_layer(config, rng, dtype) if config.moe_layer(i) else SwiGLU(h, config.intermediate_size, rng=rng,
                                                                                dtype=dtype, std=std)
        layers.append(LlamaDecoderLayer(RMSNorm(h, eps=eps, dtype=dtype), attn, RMSNorm(h, eps=eps, dtype=dtype),
                                        mlp))
    model = LlamaModel(embed, layers, RMSNorm(h, eps=eps, dtype=dtype))
    head = LMHead(config.vocab_size, h, rng=rng, dtype=dtype, std=std)
    return MixtralForCausalLM(config, model, head, CrossEntropyLoss())


class _ExpertsOrDense:
    """``from_serial`` of a layer's MLP: an ``ExpertParallelMoE`` on ``grid`` for a MoE, else a ParallelSwiGLU."""

    def __init__(self, grid: ProcessGrid, dispatcher: str, microbatches: int) -> None:
        self.grid, self.dispatcher, self.microbatches = grid, dispatcher, microbatches

    def from_serial(self, mlp, group: Group, *, region):
        if isinstance(mlp, MoE) and self.grid is None:  # decoding: every rank the whole layer, on the tokens it holds
            return copy.deepcopy(mlp)
        if isinstance(mlp, MoE):
            return ExpertParallelMoE(mlp, self.grid, self.dispatcher, region=region, microbatches=self.microbatches)
        return ParallelSwiGLU.from_serial(mlp, group, region=region)


def parallel_mixtral(serial: MixtralForCausalLM, group: Group, *, grid: ProcessGrid | None = None,
                     dispatcher: str = "alltoall",
                     microbatches: int = 1, sequence_parallel: bool = False, tp_comm_overlap: bool = False,
                     core: AttentionCore = SERIAL_CORE) -> MixtralForCausalLM:
    """Shard a serial Mixtral over the TP ``group`` and the expert groups of ``grid`` (built with ``ep``);
    ``microbatches``: a step's, so each forward's auxiliary losses weigh 1/m (``tpsim.ep.stats``). Without a
    ``grid`` (decoding, ``tpsim.generate``: one token a step cannot be cut over SP) every MoE layer is replicated
    whole on each TP rank and routes the tokens the rank holds, which attention left the same on every rank."""
    experts = _ExpertsOrDense(grid, dispatcher, microbatches)
    return shard_decoder(serial, group, MixtralForCausalLM, SequenceParallelRMSNorm, experts,
                         sequence_parallel=sequence_parallel, tp_comm_overlap=tp_comm_overlap, core=core)

