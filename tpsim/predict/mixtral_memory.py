"""Parameters per rank of the Mixtral (``tpsim.models.mixtral``), as formulas; the planner's terms refuse it.

Pure arithmetic (no MPI). With h hidden, a heads, d = h/a, k_t the KV heads a TP rank holds, E experts of width
F, S shared experts of width F_s, L layers of which L_d dense, t the TP size, ep and etp the expert layout:

    dense part (averaged over DP)    attention 2h·a·d/t + 2·h·d·k_t, two RMSNorms 2h, per layer;
                                     a dense layer's SwiGLU 3hF/t; a MoE layer's router h·E and shared experts
                                     S·3h·F_s/t; embed_tokens and lm_head (Vp/t)·h each; the final norm h
    expert part (over expert-DP)     (L − L_d) · (E/ep) · 3hF/etp

The planner prices dense models only; experts in the planner are issue "Experts in the planner" (its own
formulas for grouped GEMMs, the all-to-all on the network and imbalance), so ``layer_matmuls``,
``layer_passes`` and ``paper_layer_elements`` say so instead of pricing a MoE as something else.
"""

from __future__ import annotations

from tpsim.arch.shape import kv_heads_per_rank
from tpsim.errors import ConfigError
from tpsim.partition import padded_vocab_size

ACTIVATION_SOURCE = "not priced: the planner does not model experts yet"
ATTENTION_DROPOUT = False


def _attention(shape, tp: int) -> int:
    h, d, a = shape.hidden, shape.head_dim, shape.heads
    return 2 * h * a * d // tp + 2 * h * d * kv_heads_per_rank(shape, tp) + 2 * h


def dense_param_elements(config, tp: int) -> int:
    """Elements of this TP rank's dense parameters (module docstring): what DP × CP averages."""
    h, F = config.hidden_size, config.intermediate_size
    moe = config.num_hidden_layers - config.first_dense_layers
    per_moe = h * config.num_local_experts + config.shared_experts * 3 * h * config.shared_ffn // tp
    return (config.num_hidden_layers * _attention(config, tp) + config.first_dense_layers * 3 * h * F // tp
            + moe * per_moe + 2 * padded_vocab_size(config.vocab_size, tp) // tp * h + h)


def dense_layer_elements(config, tp: int, i: int) -> int:
    """Dense elements of layer ``i`` on one TP rank: attention and norms, and its SwiGLU (a dense layer) or its
    router and shared experts (a MoE layer)."""
    h = config.hidden_size
    if not config.moe_layer(i):
        return _attention(config, tp) + 3 * h * config.intermediate_size // tp
    return _attention(config, tp) + h * config.num_local_experts + config.shared_experts * 3 * h * config.shared_ffn // tp


def expert_param_elements(config, ep: int, etp: int) -> int:
    """Elements of the experts one rank holds: what expert-DP sums."""
    moe = config.num_hidden_layers - config.first_dense_layers
    return moe * config.num_local_experts // ep * 3 * config.hidden_size * config.intermediate_size // etp


def param_elements(config, tp: int, ep: int = 1, etp: int = 1) -> int:
    """Every parameter element this rank holds."""
    return dense_param_elements(config, tp) + expert_param_elements(config, ep, etp)


def layer_vector_elements(shape) -> int:
    return 2 * shape.hidden


def _not_priced(*_args, **_kwargs):
    raise ConfigError("tpsim plan does not price a mixture of experts yet (the issue \"Experts in the planner\"); "
                      "run it live: python -m tpsim.demo --arch mixtral --ep N")


layer_param_elements = layer_matmuls = layer_passes = paper_layer_elements = activation_elements = _not_priced
