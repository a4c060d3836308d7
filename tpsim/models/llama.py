"""A Llama (Touvron et al. 2023) on the GPT's wiring: serial and tensor-parallel, Hugging Face names.

    x = embed_tokens(ids)                                               [b, s, h]   (no position embedding)
    for each layer:  x = x + self_attn(input_layernorm(x))              RMSNorm, GQA with RoPE on q and k
                     x = x + mlp(post_attention_layernorm(x))           RMSNorm, SwiGLU
    logits = norm(x) · lm_headᵀ   (untied)                              vocab-parallel under TP, never gathered
    loss = mean cross-entropy(logits, labels)

``LlamaDecoderLayer``, ``LlamaModel`` and ``LlamaForCausalLM`` *are* the GPT's ``Block``, ``Transformer``
and ``GPT`` (``tpsim.models.gpt``), initialised through them with Llama's attribute names (their ``NAMES``,
``BODY``) and no learned positions: one wiring for both
architectures, so forward/backward/loss_and_grads, named_grads, the tracer's spans, DP sync, clipping, the
optimizer and checkpoints work on either. Module paths: ``model.embed_tokens``, ``model.layers.{i}.
{input_layernorm, self_attn.{q,k,v,o}_proj, post_attention_layernorm, mlp.{gate,up,down}_proj}``,
``model.norm``, ``lm_head``.

Tensor parallelism (``parallel_llama``): vocab-parallel embedding, GQA split by heads with KV heads split or
replicated (``tpsim.tp.gqa_attention``: one ``kv`` sub-group per model reduces a replicated head's
gradients), SwiGLU with matching gate/up columns (``tpsim.tp.swiglu``), RMSNorm replicated (under SP:
gradient all-reduced, ``tpsim.tp.rmsnorm``), an untied column-parallel LM head on the vocab-parallel
cross-entropy. Under sequence parallelism the embedding's output is all-reduced and then scattered, as for the
GPT (Megatron reduce-scatters in the embedding instead when there are no learned positions: the same bytes).
"""

from __future__ import annotations

import copy

import numpy as np

from tpsim.comm import Group
from tpsim.models.gpt import GPT, Block, Transformer, attach_tracer
from tpsim.arch.llama import LlamaConfig
from tpsim.nn.cross_entropy import CrossEntropyLoss
from tpsim.nn.embedding import Embedding
from tpsim.nn.attention import SERIAL_CORE, AttentionCore
from tpsim.nn.gqa_attention import GQAttention
from tpsim.nn.lm_head import LMHead
from tpsim.nn.module import Module
from tpsim.nn.rmsnorm import RMSNorm
from tpsim.nn.swiglu import SwiGLU
from tpsim.tp.cross_entropy import VocabParallelCrossEntropy
from tpsim.tp.gqa_attention import ParallelGQAttention, kv_group
from tpsim.tp.lm_head import ParallelLMHead
from tpsim.tp.regions import TP_REGION, Region, region_for
from tpsim.tp.rmsnorm import SequenceParallelRMSNorm
from tpsim.tp.swiglu import ParallelSwiGLU
from tpsim.tp.vocab_embedding import VocabParallelEmbedding


class LlamaDecoderLayer(Block):
    """Pre-norm block: ``x + self_attn(input_layernorm(x))``, then ``x + mlp(post_attention_layernorm(x))``."""

    NAMES = ("input_layernorm", "self_attn", "post_attention_layernorm", "mlp")

    def __init__(self, input_layernorm: Module, self_attn: Module, post_attention_layernorm: Module,
                 mlp: Module) -> None:
        super().__init__(input_layernorm, self_attn, post_attention_layernorm, mlp, dropout=0.0)  # no dropout


class LlamaModel(Transformer):
    """``model.{embed_tokens, layers.i, norm}``; no position embedding (RoPE acts inside attention)."""

    NAMES = ("embed_tokens", "", "layers", "norm")

    def __init__(self, embed_tokens: Module, layers: list[LlamaDecoderLayer], norm: Module, *,
                 region: Region = TP_REGION, group=None, core: AttentionCore = SERIAL_CORE) -> None:
        super().__init__(embed_tokens, None, layers, norm, dropout=0.0, region=region, group=group, core=core)


class LlamaForCausalLM(GPT):
    """``model`` + untied ``lm_head`` + ``loss``; the GPT's forward/backward/loss_and_grads."""

    BODY = "model"

    def __init__(self, config: LlamaConfig, model: LlamaModel, lm_head: Module, loss: Module) -> None:
        super().__init__(config, model, lm_head, loss)


def serial_llama(config: LlamaConfig, seed: int = 0, dtype=np.float64) -> LlamaForCausalLM:
    """The single-device model drawn from ``seed`` (Hugging Face's init: N(0, initializer_range) for every
    linear and embedding, ones for the RMSNorms), in a fixed order: the same model on every rank."""
    config.check(1)
    rng = np.random.default_rng(seed)
    std, h, eps = config.initializer_range, config.hidden_size, config.rms_norm_eps
    embed = Embedding(config.vocab_size, h, rng=rng, dtype=dtype, std=std)
    layers = [LlamaDecoderLayer(RMSNorm(h, eps=eps, dtype=dtype),
                                GQAttention(h, config.num_attention_heads, config.num_key_value_heads,
                                            rope_theta=config.rope_theta, rng=rng, dtype=dtype, std=std),
                                RMSNorm(h, eps=eps, dtype=dtype),
                                SwiGLU(h, config.intermediate_size, rng=rng, dtype=dtype, std=std))
              for _ in range(config.num_hidden_layers)]
    model = LlamaModel(embed, layers, RMSNorm(h, eps=eps, dtype=dtype))
    head = LMHead(config.vocab_size, h, rng=rng, dtype=dtype, std=std)
    return LlamaForCausalLM(config, model, head, CrossEntropyLoss())


def parallel_llama(serial: LlamaForCausalLM, group: Group, *, sequence_parallel: bool = False,
                   tp_comm_overlap: bool = False, core: AttentionCore = SERIAL_CORE) -> LlamaForCausalLM:
    """Shard a serial Llama over the TP ``group`` (collective over it: the ``kv`` sub-group is created here);
    ``core``: the attention core of every layer and the model's positions (CP: ``tpsim.cp.context.core_for``)."""
    return shard_decoder(serial, group, LlamaForCausalLM, SequenceParallelRMSNorm, ParallelSwiGLU,
                         sequence_parallel=sequence_parallel, tp_comm_overlap=tp_comm_overlap, core=core)


def shard_decoder(serial, group: Group, model_class: type, sp_norm: type, parallel_mlp: type, *,
                  sequence_parallel: bool, tp_comm_overlap: bool, core: AttentionCore):
    """The Llama wiring sharded over ``group``, for any decoder built on it (the Llama, the Nemotron): norms
    replicated (``sp_norm.from_serial`` under SP), GQA split by heads, the MLP by ``parallel_mlp.from_serial``,
    a vocab-parallel embedding, untied column-parallel head and loss; returns ``model_class(config, ...)``."""
    config = serial.config
    config.check(group.size)
    sp, region = sequence_parallel, region_for(sequence_parallel, tp_comm_overlap)
    norm = (lambda m: sp_norm.from_serial(m, group)) if sp else copy.deepcopy
    kv_sync = kv_group(group, config.num_attention_heads, config.num_key_value_heads)  # one for all layers
    embed = VocabParallelEmbedding.from_serial(serial.model.embed_tokens, group)
    layers = [LlamaDecoderLayer(norm(layer.input_layernorm),
                                ParallelGQAttention.from_serial(layer.self_attn, group, region=region,
                                                                kv_sync=kv_sync, core=core),
                                norm(layer.post_attention_layernorm),
                                parallel_mlp.from_serial(layer.mlp, group, region=region))
              for layer in serial.model.layers]
    model = LlamaModel(embed, layers, norm(serial.model.norm), region=region, group=group, core=core)
    w = serial.lm_head.params["weight"]  # [V, h]: sharded by vocabulary rows exactly like an embedding table
    head = ParallelLMHead(VocabParallelEmbedding(w.shape[0], w.shape[1], group, dtype=w.dtype, weight=w),
                          tied=False, region=region)
    loss = VocabParallelCrossEntropy(group, vocab_size=embed.vocab_size, vocab_start=embed.vocab_start,
                                     ignore_index=serial.loss.ignore_index)
    return attach_tracer(model_class(config, model, head, loss), group.tracer)


def build_llama(config: LlamaConfig, group: Group, seed: int = 0, dtype=np.float64, *,
                sequence_parallel: bool = False) -> LlamaForCausalLM:
    """The TP model straight from a seed (the serial master is drawn, sharded, and dropped)."""
    config.check(group.size)  # before drawing anything: a bad config fails fast and the same on every rank
    return parallel_llama(serial_llama(config, seed, dtype), group, sequence_parallel=sequence_parallel)
