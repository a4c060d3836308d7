"""Tensor-parallel operators and layers, built on the traced communication layer and the serial math."""

from tpsim.partition import divide, padded_vocab_size, shard_range, take_shard, uneven_ranges, vocab_range
from tpsim.tp.attention import ParallelSelfAttention, head_columns
from tpsim.tp.column_parallel import ColumnParallelLinear, column_parallel_backward, column_parallel_forward
from tpsim.tp.cross_entropy import (VocabParallelCrossEntropy, VocabParallelCrossEntropyCache,
                                    vocab_parallel_cross_entropy_backward, vocab_parallel_cross_entropy_forward)
from tpsim.tp.lm_head import ParallelLMHead
from tpsim.tp.mappings import CopyToTPRegion, GatherFromTPRegion, ReduceFromTPRegion, ScatterToTPRegion
from tpsim.tp.mlp import ParallelMLP
from tpsim.tp.multi_output_column_parallel import MultiOutputColumnParallelLinear
from tpsim.tp.random import DropoutRNG, ExactDropoutRNG, MegatronDropoutRNG, make_dropout_rng
from tpsim.tp.regions import SP_REGION, TP_REGION, SequenceParallelRegion, TensorParallelRegion, region_for
from tpsim.tp.row_parallel import RowParallelLinear
from tpsim.tp.sequence_parallel import (GatherFromSequenceParallelRegion, ReduceScatterToSequenceParallelRegion,
                                        ScatterToSequenceParallelRegion, gather_sequence)
from tpsim.tp.sequence_parallel_layernorm import SequenceParallelLayerNorm
from tpsim.tp.vocab_embedding import VocabEmbeddingCache, VocabParallelEmbedding

__all__ = [
    # the conjugate operators f, g and their scatter/gather cousins (each class names its Megatron function)
    "CopyToTPRegion", "ReduceFromTPRegion", "ScatterToTPRegion", "GatherFromTPRegion",
    # sequence parallelism: f̄ and ḡ along the sequence
    "GatherFromSequenceParallelRegion", "ReduceScatterToSequenceParallelRegion", "ScatterToSequenceParallelRegion",
    "gather_sequence", "SequenceParallelLayerNorm",
    # entering and leaving the TP region: (f, g), or (f̄, ḡ) under sequence parallelism, chosen when a layer is built
    "TensorParallelRegion", "SequenceParallelRegion", "TP_REGION", "SP_REGION", "region_for",
    # layers
    "ColumnParallelLinear", "column_parallel_forward", "column_parallel_backward", "RowParallelLinear",
    "MultiOutputColumnParallelLinear",
    "ParallelMLP", "ParallelSelfAttention", "head_columns",
    "VocabParallelEmbedding", "VocabEmbeddingCache", "ParallelLMHead", "VocabParallelCrossEntropy", "VocabParallelCrossEntropyCache",
    "vocab_parallel_cross_entropy_forward", "vocab_parallel_cross_entropy_backward",
    # dropout RNG tracker
    "DropoutRNG", "ExactDropoutRNG", "MegatronDropoutRNG", "make_dropout_rng",
    # partition arithmetic
    "divide", "shard_range", "take_shard", "uneven_ranges", "padded_vocab_size", "vocab_range",
]
