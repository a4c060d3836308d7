"""Serial layers with hand-written backward (no MPI): the math the tensor-parallel layers in ``tpsim.tp`` reuse.

Every layer follows the one contract stated in ``tpsim.nn.module``: ``forward -> (out, cache)``,
``backward(dout, cache) -> gradients``, caches of several parts as named tuples.
"""

from tpsim.nn.activations import GeLU, GeluCache, erf, erfc, gelu_backward, gelu_forward
from tpsim.nn.attention import (SERIAL_CORE, AttentionCache, AttentionCore, AttentionCoreCache, CausalSelfAttention,
                                MultiHeadAttention, SerialCore, attention_core_backward, attention_core_forward,
                                qkv_attention_backward, qkv_attention_forward)
from tpsim.nn.cross_entropy import (
    CrossEntropyCache,
    CrossEntropyLoss,
    softmax_cross_entropy_backward,
    softmax_cross_entropy_forward,
)
from tpsim.nn.dropout import (Dropout, DropoutCache, DropoutPlan, dropout_backward, dropout_forward,
                              dropout_mask_apply, replicated_dropout)
from tpsim.nn.embedding import Embedding
from tpsim.nn.gradcheck import check_module_grads, numerical_grad, relative_error
from tpsim.nn.layernorm import LayerNorm, LayerNormCache, layernorm_backward, layernorm_forward
from tpsim.nn.linear import Linear, LinearCache, linear_backward, linear_forward
from tpsim.nn.mlp import MLP, GeluMLP, MLPCache
from tpsim.nn.multi_output_linear import MultiOutputLinear
from tpsim.nn.module import Entry, Module, Partition
from tpsim.nn.softmax import Softmax, SoftmaxCache, softmax_backward, softmax_forward

__all__ = [
    "Module",
    "Entry",
    "Partition",
    "MLP",
    "GeluMLP",
    "MLPCache",
    "MultiOutputLinear",
    "MultiHeadAttention",
    "CausalSelfAttention",
    "AttentionCache",
    "AttentionCoreCache",
    "AttentionCore",
    "SerialCore",
    "SERIAL_CORE",
    "attention_core_forward",
    "attention_core_backward",
    "qkv_attention_forward",
    "qkv_attention_backward",
    "Linear",
    "LinearCache",
    "linear_forward",
    "linear_backward",
    "GeLU",
    "GeluCache",
    "gelu_forward",
    "gelu_backward",
    "erf",
    "erfc",
    "LayerNorm",
    "LayerNormCache",
    "layernorm_forward",
    "layernorm_backward",
    "Softmax",
    "SoftmaxCache",
    "softmax_forward",
    "softmax_backward",
    "Dropout",
    "DropoutCache",
    "DropoutPlan",
    "dropout_forward",
    "dropout_backward",
    "dropout_mask_apply",
    "replicated_dropout",
    "Embedding",
    "CrossEntropyLoss",
    "CrossEntropyCache",
    "softmax_cross_entropy_forward",
    "softmax_cross_entropy_backward",
    "numerical_grad",
    "relative_error",
    "check_module_grads",
]
