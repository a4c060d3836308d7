"""Building the GPT: the serial master model from a seed, and its tensor-parallel twin from that master.

Master weights make TP equal serial at any TP size: every rank draws the *whole* serial model from the same
seed (GPT-2's initialisation: N(0, 0.02) weights, residual projections N(0, 0.02/√(2·n_layer)), LayerNorm
ones/zeros, zero biases), then keeps its shards. The draw order is fixed, so ``serial_gpt(cfg, seed)`` is
the same model on every rank, at every TP size, in every run.

``sequence_parallel=True`` (Megatron-SP) builds the same shards; only the kind of the LayerNorms (gradients
all-reduced over TP) and the region the linears and the LM head are built with change (``SP_REGION``: f̄/ḡ
instead of f/g, ``tpsim.tp.regions``; the flag is read here, once), so an SP model and a TP model from one
seed hold identical parameters and export identical checkpoints.
"""

from __future__ import annotations

import copy

import numpy as np

from tpsim.comm import Group
from tpsim.arch.gpt2 import GPTConfig
from tpsim.models.gpt import GPT, Block, Transformer, attach_tracer
from tpsim.nn.attention import SERIAL_CORE, AttentionCore, CausalSelfAttention
from tpsim.nn.cross_entropy import CrossEntropyLoss
from tpsim.nn.embedding import Embedding
from tpsim.nn.layernorm import LayerNorm
from tpsim.nn.lm_head import TiedLMHead
from tpsim.nn.mlp import MLP
from tpsim.tp.attention import ParallelSelfAttention
from tpsim.tp.cross_entropy import VocabParallelCrossEntropy
from tpsim.tp.lm_head import ParallelLMHead
from tpsim.tp.mlp import ParallelMLP
from tpsim.tp.regions import region_for
from tpsim.tp.sequence_parallel_layernorm import SequenceParallelLayerNorm
from tpsim.tp.vocab_embedding import VocabParallelEmbedding


def serial_gpt(config: GPTConfig, seed: int = 0, dtype=np.float64) -> GPT:
    """The single-device model, drawn from ``seed``."""
    config.check(1)
    rng = np.random.default_rng(seed)
    std, h = config.initializer_range, config.n_embd
    proj_std = std / np.sqrt(2 * config.n_layer)
    wte = Embedding(config.vocab_size, h, rng=rng, dtype=dtype, std=std)
    wpe = Embedding(config.n_positions, h, rng=rng, dtype=dtype, std=std)
    blocks = []
    for _ in range(config.n_layer):
        attn = CausalSelfAttention(h, config.n_head, rng=rng, dtype=dtype, std=std, proj_std=proj_std,
                                   attn_dropout=config.dropout)
        mlp = MLP(h, 4 * h, rng=rng, dtype=dtype, std=std, proj_std=proj_std)
        blocks.append(Block(LayerNorm(h, eps=config.layer_norm_epsilon, dtype=dtype), attn,
                            LayerNorm(h, eps=config.layer_norm_epsilon, dtype=dtype), mlp, config.dropout))
    ln_f = LayerNorm(h, eps=config.layer_norm_epsilon, dtype=dtype)
    transformer = Transformer(wte, wpe, blocks, ln_f, config.dropout)
    return GPT(config, transformer, TiedLMHead(wte), CrossEntropyLoss())


def parallel_gpt(serial: GPT, group: Group, *, sequence_parallel: bool = False, tp_comm_overlap: bool = False,
                 core: AttentionCore = SERIAL_CORE) -> GPT:
    """Shard a serial GPT over the TP ``group``: vocab-parallel embedding/head/loss, attention split by heads,
    parallel MLP; LayerNorms and the position embedding replicated (copied).

    ``sequence_parallel``: LayerNorms, dropouts and residual adds work on [b, s/tp, h] (every batch's
    sequence length must then divide by tp; checked in the forward, before any collective). ``core``: the
    attention core every attention layer attends with and whose positions the embedding takes (context
    parallelism: ``tpsim.cp.context.core_for``)."""
    config = serial.config
    config.check(group.size)
    tr = serial.transformer
    sp, region = sequence_parallel, region_for(sequence_parallel, tp_comm_overlap)
    ln = (lambda m: SequenceParallelLayerNorm.from_serial(m, group)) if sp else copy.deepcopy
    wte = VocabParallelEmbedding.from_serial(tr.wte, group)
    blocks = [Block(ln(b.ln_1), ParallelSelfAttention.from_serial(b.attn, group, region=region, core=core),
                    ln(b.ln_2), ParallelMLP.from_serial(b.mlp, group, region=region), b.dropout)
              for b in tr.h]
    transformer = Transformer(wte, copy.deepcopy(tr.wpe), blocks, ln(tr.ln_f), tr.dropout, region=region,
                              group=group, core=core)
    head = ParallelLMHead(wte, region=region)
    loss = VocabParallelCrossEntropy(group, vocab_size=wte.vocab_size, vocab_start=wte.vocab_start,
                                     ignore_index=serial.loss.ignore_index)
    # the grid's tracer times every sub-layer call (compute spans beside the collectives on the timeline)
    return attach_tracer(GPT(config, transformer, head, loss), group.tracer)


def build_gpt(config: GPTConfig, group: Group, seed: int = 0, dtype=np.float64, *,
              sequence_parallel: bool = False) -> GPT:
    """The TP model straight from a seed (the serial master is drawn, sharded, and dropped)."""
    config.check(group.size)  # before drawing anything: a bad config fails fast and the same on every rank
    return parallel_gpt(serial_gpt(config, seed, dtype), group, sequence_parallel=sequence_parallel)
