"""Nemotron-4 (Parmar et al. 2024) on the Llama's wiring: serial and tensor-parallel, Hugging Face names.

    x = embed_tokens(ids)                                               [b, s, h]   (no position embedding)
    for each layer:  x = x + self_attn(input_layernorm(x))              LayerNorm1P, GQA, RoPE on half a head
                     x = x + mlp(post_attention_layernorm(x))           LayerNorm1P, up → relu² → down
    logits = norm(x) · lm_headᵀ   (untied)                              vocab-parallel under TP, never gathered

The blocks, the body and the head are the Llama's (``tpsim.models.llama``: the GPT's wiring under Hugging Face's
Llama names, which ``NemotronForCausalLM`` shares); only the parts differ — ``LayerNorm1P``
(``tpsim.nn.layernorm_1p``) for RMSNorm, ``SquaredReluMLP`` (``tpsim.nn.relu2``) for SwiGLU, and attention with
``rotary_dim`` = partial_rotary_factor · head_dim. Module paths: ``model.embed_tokens``, ``model.layers.{i}.
{input_layernorm, self_attn.{q,k,v,o}_proj, post_attention_layernorm, mlp.{up,down}_proj}``, ``model.norm``,
``lm_head``.

Tensor parallelism (``parallel_nemotron``): vocab-parallel embedding, GQA split by heads with KV heads split or
replicated (``tpsim.tp.gqa_attention``), up_proj column- and down_proj row-parallel (``tpsim.tp.relu2_mlp``),
LayerNorm1P replicated (under SP: weight and bias gradients all-reduced as one [2, h] message,
``tpsim.tp.sequence_parallel_layernorm.SequenceParallelLayerNorm1P``), the untied column-parallel LM head on the
vocab-parallel cross-entropy.
"""

from __future__ import annotations

import numpy as np

from tpsim.arch.nemotron import NemotronConfig
from tpsim.comm import Group
from tpsim.models.llama import LlamaDecoderLayer, LlamaForCausalLM, LlamaModel, shard_decoder
from tpsim.nn.attention import SERIAL_CORE, AttentionCore
from tpsim.nn.cross_entropy import CrossEntropyLoss
from tpsim.nn.embedding import Embedding
from tpsim.nn.gqa_attention import GQAttention
from tpsim.nn.layernorm_1p import LayerNorm1P
from tpsim.nn.lm_head import LMHead
from tpsim.nn.relu2 import SquaredReluMLP
from tpsim.tp.relu2_mlp import ParallelRelu2MLP
from tpsim.tp.sequence_parallel_layernorm import SequenceParallelLayerNorm1P


class NemotronForCausalLM(LlamaForCausalLM):
    """``model`` + untied ``lm_head`` + ``loss``, with Nemotron's parts (the Llama's wiring and names)."""


def serial_nemotron(config: NemotronConfig, seed: int = 0, dtype=np.float64) -> NemotronForCausalLM:
    """The single-device model drawn from ``seed``: N(0, initializer_range) for every linear and the embedding,
    zeros for the norms' stored weights (scale 1 + 0) and biases, in a fixed order: the same on every rank."""
    config.check(1)
    rng = np.random.default_rng(seed)
    std, h, eps = config.initializer_range, config.hidden_size, config.norm_eps
    embed = Embedding(config.vocab_size, h, rng=rng, dtype=dtype, std=std)
    layers = [LlamaDecoderLayer(LayerNorm1P(h, eps=eps, dtype=dtype),
                                GQAttention(h, config.num_attention_heads, config.num_key_value_heads,
                                            rope_theta=config.rope_theta, rotary_dim=config.rotary_dim, rng=rng,
                                            dtype=dtype, std=std),
                                LayerNorm1P(h, eps=eps, dtype=dtype),
                                SquaredReluMLP(h, config.intermediate_size, rng=rng, dtype=dtype, std=std))
              for _ in range(config.num_hidden_layers)]
    model = LlamaModel(embed, layers, LayerNorm1P(h, eps=eps, dtype=dtype))
    head = LMHead(config.vocab_size, h, rng=rng, dtype=dtype, std=std)
    return NemotronForCausalLM(config, model, head, CrossEntropyLoss())


def parallel_nemotron(serial: NemotronForCausalLM, group: Group, *, sequence_parallel: bool = False,
                      tp_comm_overlap: bool = False, core: AttentionCore = SERIAL_CORE) -> NemotronForCausalLM:
    """Shard a serial Nemotron over the TP ``group`` (collective over it: the ``kv`` sub-group is created here);
    ``core``: the attention core of every layer and the model's positions (CP: ``tpsim.cp.context.core_for``)."""
    return shard_decoder(serial, group, NemotronForCausalLM, SequenceParallelLayerNorm1P, ParallelRelu2MLP,
                         sequence_parallel=sequence_parallel, tp_comm_overlap=tp_comm_overlap, core=core)
