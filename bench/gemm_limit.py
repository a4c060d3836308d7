"""The GEMM limit of a step: its matmul FLOPs from the shapes, and the time no implementation on this box can beat.

Pure arithmetic (no MPI, no torch), so tests/test_bench_vs_torch.py checks it by hand. A GEMM here is
``[m, k] @ [k, n]`` repeated ``batch`` times, 2·m·k·n·batch FLOPs. A linear layer ``y = x·W`` with ``x: [T, in]``
costs three per step: the forward ``(T, in, out)``, the weight gradient ``xᵀ·dy`` ``(in, T, out)`` and the input
gradient ``dy·Wᵀ`` ``(T, out, in)``. Every list below is *one rank's* GEMMs of one forward + backward.

The limit: a rank's FLOPs ÷ the single-thread GEMM rate measured on those very shapes, times the ranks that
share each core (ranks / cores, at least 1: a rank is one thread and cannot use a second core).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Gemm:
    m: int
    k: int
    n: int
    batch: int = 1  # a batched matmul: b·heads independent products

    @property
    def flops(self) -> int:
        return 2 * self.m * self.k * self.n * self.batch


def linear_gemms(tokens: int, fan_in: int, fan_out: int) -> list[Gemm]:
    """Forward, weight gradient, input gradient of ``[tokens, fan_in] @ [fan_in, fan_out]``."""
    return [Gemm(tokens, fan_in, fan_out), Gemm(fan_in, tokens, fan_out), Gemm(tokens, fan_out, fan_in)]


def mlp_gemms(tokens: int, hidden: int, ffn: int, tp: int) -> list[Gemm]:
    """Column-parallel c_fc ``[h, ffn/tp]`` then row-parallel c_proj ``[ffn/tp, h]`` (Shoeybi et al. 2019, Fig. 3a)."""
    return linear_gemms(tokens, hidden, ffn // tp) + linear_gemms(tokens, ffn // tp, hidden)


def attention_core_gemms(batch: int, heads_local: int, seq: int, head_dim: int) -> list[Gemm]:
    """q·kᵀ and probs·v forward; dv = Pᵀ·dctx, dP = dctx·vᵀ, dq = dS·k, dk = dSᵀ·q backward.

    The full s × s scores, causal mask or not: tpsim computes them all, and so does the torch side here."""
    bh = batch * heads_local
    scores = Gemm(seq, head_dim, seq, bh)  # [s, hd] @ [hd, s]
    context = Gemm(seq, seq, head_dim, bh)  # [s, s] @ [s, hd]
    return [scores, context, context, scores, context, context]


def attention_gemms(batch: int, seq: int, hidden: int, heads: int, tp: int) -> list[Gemm]:
    """Attention split by heads: c_attn ``[h, 3h/tp]``, the core on heads/tp heads, c_proj ``[h/tp, h]``."""
    tokens = batch * seq
    return (linear_gemms(tokens, hidden, 3 * hidden // tp)
            + attention_core_gemms(batch, heads // tp, seq, hidden // heads)
            + linear_gemms(tokens, hidden // tp, hidden))


def block_gemms(batch: int, seq: int, hidden: int, heads: int, tp: int) -> list[Gemm]:
    """One pre-LN GPT-2 block: attention + MLP (4h); LayerNorms and residuals are not GEMMs."""
    return attention_gemms(batch, seq, hidden, heads, tp) + mlp_gemms(batch * seq, hidden, 4 * hidden, tp)


def gpt_gemms(batch: int, seq: int, hidden: int, heads: int, layers: int, padded_vocab: int, tp: int) -> list[Gemm]:
    """The whole GPT on one rank's ``batch`` sequences: the blocks, then the tied vocab-parallel LM head.

    The head ``logits = x·wteᵀ`` with ``wte: [V/tp, h]`` is a linear of fan-in h and fan-out V/tp; the embedding
    lookup and its scatter-add backward are no GEMMs.
    """
    blocks = [g for _ in range(layers) for g in block_gemms(batch, seq, hidden, heads, tp)]
    return blocks + linear_gemms(batch * seq, hidden, padded_vocab // tp)


def total_flops(gemms: list[Gemm]) -> int:
    return sum(g.flops for g in gemms)


def ranks_per_core(ranks: int, cores: int) -> float:
    """How many ranks share each core, at least 1 (one BLAS thread per rank: a spare core does not help)."""
    if ranks < 1 or cores < 1:
        raise ValueError(f"ranks and cores must be >= 1, got {ranks} and {cores}")
    return max(1.0, ranks / cores)


def gemm_limit_seconds(flops_per_rank: float, rate_flops_per_s: float, ranks: int, cores: int) -> float:
    """The step time no implementation beats here: one rank's GEMM time at the measured rate, × ranks per core."""
    if rate_flops_per_s <= 0:
        raise ValueError(f"GEMM rate must be > 0, got {rate_flops_per_s}")
    return flops_per_rank / rate_flops_per_s * ranks_per_core(ranks, cores)
