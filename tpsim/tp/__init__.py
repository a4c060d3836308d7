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
