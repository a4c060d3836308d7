"""Serial layers with hand-written backward (no MPI): the math the tensor-parallel layers in ``tpsim.tp`` reuse."""

from tpsim.nn.activations import GeLU, erf, gelu_backward, gelu_forward
from tpsim.nn.attention import (CausalSelfAttention, attention_core_backward, attention_core_forward,
                                qkv_attention_backward, qkv_attention_forward)
from tpsim.nn.cross_entropy import (
    CrossEntropyLoss,
    softmax_cross_entropy_backward,
    softmax_cross_entropy_forward,
)
from tpsim.nn.dropout import Dropout, dropout_mask_apply
from tpsim.nn.embedding import Embedding
from tpsim.nn.gradcheck import check_module_grads, numerical_grad, relative_error
from tpsim.nn.layernorm import LayerNorm, layernorm_backward, layernorm_forward
from tpsim.nn.linear import Linear, linear_backward, linear_forward
from tpsim.nn.mlp import MLP
from tpsim.nn.module import Entry, Module, Partition
from tpsim.nn.softmax import Softmax, softmax_backward, softmax_forward

__all__ = [
    "Module",
    "Entry",
    "Partition",
    "MLP",
    "CausalSelfAttention",
    "attention_core_forward",
    "attention_core_backward",
    "qkv_attention_forward",
    "qkv_attention_backward",
    "Linear",
    "linear_forward",
    "linear_backward",
    "GeLU",
    "gelu_forward",
    "gelu_backward",
    "erf",
    "LayerNorm",
    "layernorm_forward",
    "layernorm_backward",
    "Softmax",
    "softmax_forward",
    "softmax_backward",
    "Dropout",
    "dropout_mask_apply",
    "Embedding",
    "CrossEntropyLoss",
    "softmax_cross_entropy_forward",
    "softmax_cross_entropy_backward",
    "numerical_grad",
    "relative_error",
    "check_module_grads",
]
