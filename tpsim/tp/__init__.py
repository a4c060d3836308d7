"""Tensor-parallel operators and layers built on the traced communication layer and the serial math."""

from tpsim.tp.column_parallel import ColumnParallelLinear
from tpsim.tp.mappings import (CopyToTPRegion, GatherFromTPRegion, ReduceFromTPRegion, ScatterToTPRegion,
                               copy_to_tensor_model_parallel_region, gather_from_tensor_model_parallel_region,
                               reduce_from_tensor_model_parallel_region, scatter_to_tensor_model_parallel_region)
from tpsim.tp.mlp import ParallelMLP
from tpsim.tp.partition import divide, shard_range, uneven_ranges
from tpsim.tp.row_parallel import RowParallelLinear

__all__ = ["ColumnParallelLinear", "CopyToTPRegion", "GatherFromTPRegion", "ParallelMLP", "ReduceFromTPRegion",
           "RowParallelLinear", "ScatterToTPRegion", "copy_to_tensor_model_parallel_region", "divide",
           "gather_from_tensor_model_parallel_region", "reduce_from_tensor_model_parallel_region",
           "scatter_to_tensor_model_parallel_region", "shard_range", "uneven_ranges"]

# vocabulary parallelism: padded vocab ranges, embedding, tied LM head, vocab-parallel cross-entropy
from tpsim.tp.cross_entropy import (VocabParallelCrossEntropy, VocabParallelCrossEntropyCache,
                                    vocab_parallel_cross_entropy_backward, vocab_parallel_cross_entropy_forward)
from tpsim.tp.lm_head import ParallelLMHead
from tpsim.tp.vocab import padded_vocab_size, vocab_range
from tpsim.tp.vocab_embedding import VocabParallelEmbedding

__all__ += ["ParallelLMHead", "VocabParallelCrossEntropy", "VocabParallelCrossEntropyCache", "VocabParallelEmbedding",
            "padded_vocab_size", "vocab_parallel_cross_entropy_backward", "vocab_parallel_cross_entropy_forward",
            "vocab_range"]

# attention split by heads, and the dropout RNG tracker (exact / Megatron schemes)
from tpsim.tp.attention import ParallelSelfAttention, head_columns
from tpsim.tp.random import DropoutRNG, ExactDropoutRNG, MegatronDropoutRNG, make_dropout_rng

__all__ += ["DropoutRNG", "ExactDropoutRNG", "MegatronDropoutRNG", "ParallelSelfAttention", "head_columns",
            "make_dropout_rng"]
