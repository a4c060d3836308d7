"""Tensor-parallel operators and layers, built on the traced communication layer and the serial math."""

from tpsim.partition import divide, padded_vocab_size, shard_range, take_shard, uneven_ranges, vocab_range
from tpsim.tp.attention import ParallelSelfAttention, head_columns
from tpsim.tp.column_parallel import ColumnParallelLinear
from tpsim.tp.cross_entropy import (VocabParallelCrossEntropy, VocabParallelCrossEntropyCache,
                                    vocab_parallel_cross_entropy_backward, vocab_parallel_cross_entropy_forward)
from tpsim.tp.lm_head import ParallelLMHead
from tpsim.tp.mappings import (CopyToTPRegion, GatherFromTPRegion, ReduceFromTPRegion, ScatterToTPRegion,
                               copy_to_tensor_model_parallel_region, gather_from_tensor_model_parallel_region,
                               reduce_from_tensor_model_parallel_region, scatter_to_tensor_model_parallel_region)
from tpsim.tp.mlp import ParallelMLP
from tpsim.tp.random import DropoutRNG, ExactDropoutRNG, MegatronDropoutRNG, make_dropout_rng
from tpsim.tp.row_parallel import RowParallelLinear
from tpsim.tp.sequence_parallel import (GatherFromSequenceParallelRegion, ReduceScatterToSequenceParallelRegion,
                                        ScatterToSequenceParallelRegion, gather_from_sequence_parallel_region,
                                        reduce_scatter_to_sequence_parallel_region,
                                        scatter_to_sequence_parallel_region)
from tpsim.tp.sequence_parallel_layers import SequenceParallelLayerNorm, SequenceParallelLMHead
from tpsim.tp.vocab_embedding import VocabParallelEmbedding

__all__ = [
    # the conjugate operators f, g and their scatter/gather cousins (Megatron names too)
    "CopyToTPRegion", "ReduceFromTPRegion", "ScatterToTPRegion", "GatherFromTPRegion",
    "copy_to_tensor_model_parallel_region", "reduce_from_tensor_model_parallel_region",
    "scatter_to_tensor_model_parallel_region", "gather_from_tensor_model_parallel_region",
    # sequence parallelism: f̄ and ḡ along the sequence
    "GatherFromSequenceParallelRegion", "ReduceScatterToSequenceParallelRegion", "ScatterToSequenceParallelRegion",
    "gather_from_sequence_parallel_region", "reduce_scatter_to_sequence_parallel_region",
    "scatter_to_sequence_parallel_region", "SequenceParallelLayerNorm", "SequenceParallelLMHead",
    # layers
    "ColumnParallelLinear", "RowParallelLinear", "ParallelMLP", "ParallelSelfAttention", "head_columns",
    "VocabParallelEmbedding", "ParallelLMHead", "VocabParallelCrossEntropy", "VocabParallelCrossEntropyCache",
    "vocab_parallel_cross_entropy_forward", "vocab_parallel_cross_entropy_backward",
    # dropout RNG tracker
    "DropoutRNG", "ExactDropoutRNG", "MegatronDropoutRNG", "make_dropout_rng",
    # partition arithmetic
    "divide", "shard_range", "take_shard", "uneven_ranges", "padded_vocab_size", "vocab_range",
]
