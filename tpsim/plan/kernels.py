"""One transformer layer as the kernels a GPU runs: every matmul with its shape, every memory-bound pass with its
bytes — what the planner's time of a layer is built from (``tpsim.plan.kernel_time`` prices them).

Per micro-batch of T = b·s tokens on one GPU of a TP group of t (r = t under sequence parallelism, else 1: the
norm, dropout and residual regions hold T/r tokens; e the activation bytes, 2 in 16 bits; a heads, g KV heads,
d = h/a), in the order Megatron-LM's layer runs them with its fused kernels (fused LayerNorm, fused
scale-mask-softmax, fused bias-GeLU, fused bias-dropout-add; Korthikanti et al. 2022 §4.1 list the same
tensors):

    GPT forward      norm 2e·Th/r · QKV matmul [T, h]×[h, 3h/t] · scores a/t × [s, d]×[d, s] (per sequence)
                     · softmax 2e·S · dropout (2e + 1)·S · context a/t × [s, s]×[s, d] · proj [T, h/t]×[h/t, h]
                     · bias-dropout-add (3e + 1)·Th/r · norm 2e·Th/r · FC1 [T, h]×[h, 4h/t] · bias-GeLU
                     2e·4Th/t · FC2 [T, 4h/t]×[4h/t, h] · bias-dropout-add (3e + 1)·Th/r
    Llama forward    RMSNorm, QKV [T, h]×[h, (a + 2g)d/t], RoPE 2e·(a + g)dT/t, scores, softmax 2e·S, context,
                     proj, residual add 3e·Th/r, RMSNorm, gate|up [T, h]×[h, 2f/t], SwiGLU 3e·Tf/t, down
                     [T, f/t]×[f/t, h], residual add 3e·Th/r         (S = b·(a/t)·s² scores; no dropout)

A matmul's bytes are its two inputs and its output; the backward's input-gradient half (B) runs each matmul's
dX (its forward's FLOPs), both attention products' two gradients, and every memory-bound pass at twice its
forward bytes (it reads the saved tensor and the incoming gradient and writes one: an assumption, stated);
the weight-gradient half (W) runs each weight matmul's dW. Full recompute repeats the forward in B; selective
recompute repeats the scores, softmax, dropout and context. ``--attention fused`` (a flash-style kernel, Dao et
al. 2022) replaces scores → context by one kernel that reads q, k, v and writes the context — no S in memory:
its forward does the two products' FLOPs, its backward their four gradients plus the scores again (Dao et al.
2022 §3.1: the backward recomputes S from q and k), so selective recompute has nothing left to repeat.
"""

from __future__ import annotations

from typing import NamedTuple

from tpsim.partition import padded_vocab_size
from tpsim.plan.cp_shape import attention_rows, flash
from tpsim.plan.layout import Layout
from tpsim.plan.memory import ACT_BYTES
from tpsim.plan.models import ModelSpec


class Kernel(NamedTuple):
    """One kernel: a matmul (``batch`` × [m, k]×[k, n]) or a memory-bound pass of ``nbytes`` (m = n = k = 0)."""

    name: str
    m: int = 0
    n: int = 0
    k: int = 0
    batch: int = 1
    nbytes: float = 0.0

    @property
    def is_matmul(self) -> bool:
        return self.m > 0

    @property
    def flops(self) -> float:
        return 2.0 * self.batch * self.m * self.n * self.k

    def matmul_bytes(self, e: int) -> float:
        return float(self.batch * e * (self.m * self.k + self.k * self.n + self.m * self.n))


def _weights(model: ModelSpec, lay: Layout) -> list[tuple[str, int, int]]:
    """The layer's weight matmuls as ``(name, in, out)`` on one TP rank, in forward order (the architecture's)."""
    return model.architecture.memory.layer_matmuls(model, lay.tp)


def _passes(model: ModelSpec, lay: Layout) -> list[tuple[str, float, int]]:
    """The layer's memory-bound forward passes as ``(name, bytes, slot)``, the attention's scores apart."""
    return model.architecture.memory.layer_passes(model, lay.micro_batch * lay.local_seq, lay.tp, lay.sp,
                                                  ACT_BYTES[lay.dtype])


FLASH_TILE = 128  # FlashAttention-2's key/query block on Hopper and Ampere (Dao 2023, §3.1; its kernels' kBlockN)


def causal_tiles(s: int) -> float:
    """The fraction of a causal [s, s] score square a flash kernel computes: it skips the tiles above the
    diagonal and computes the diagonal ones whole (Dao 2023, FlashAttention-2 §3.1.1), (n + 1) / 2n of the
    n² tiles, n = ⌈s / FLASH_TILE⌉. The same fraction of each CP rank's [q, k] (zigzag or Ulysses: a rank's
    causal pairs are that fraction of its rectangle; contiguous: ``busiest_share`` already counts in pairs).
    An unfused attention computes the whole square and masks it, so only the flash kernel takes it."""
    n = -(-s // FLASH_TILE)
    return (n + 1) / (2 * n)


def attention(model: ModelSpec, lay: Layout, op: str) -> list[Kernel]:
    """The attention core's kernels for ``op`` "F" (forward) or "B" (its gradients; recompute apart): per
    sequence ``heads`` × [q, d]·[d, k] products, q query rows against k keys (``tpsim.plan.cp_shape``: q = k = s
    at cp 1)."""
    e, d, b = ACT_BYTES[lay.dtype], model.head_dim, lay.micro_batch
    per_sequence, q, k = attention_rows(model, lay)
    heads = b * per_sequence
    scores = heads * q * k
    if flash(lay):
        qkvo = e * heads * d * (2 * q + 2 * k)  # q and the context [q, d], k and v [k, d]
        products = 2 if op == "F" else 5  # forward QKᵀ, PV; backward dP, dV, dS→dQ, dK and S again
        work = heads * products * causal_tiles(lay.seq_len)
        return [Kernel("flash_attention", q, k, d, work, 0.0)._replace(nbytes=qkvo * (1 + (op != "F")))]
    passes = [Kernel("softmax", nbytes=2 * e * scores)]
    if model.architecture.memory.ATTENTION_DROPOUT:
        passes.append(Kernel("attention_dropout", nbytes=(2 * e + 1) * scores))
    if op == "F":
        return [Kernel("scores", q, k, d, heads), *passes, Kernel("context", q, d, k, heads)]
    grads = [Kernel("d_context_v", k, d, q, heads), Kernel("d_probs", q, k, d, heads)]
    return grads + [p._replace(nbytes=2 * p.nbytes) for p in passes] + [
        Kernel("d_q", q, d, k, heads), Kernel("d_k", k, d, q, heads)]


def forward(model: ModelSpec, lay: Layout) -> list[Kernel]:
    """One layer's forward kernels in the order they run (the module docstring's table): the architecture's
    passes each in its slot between qkv, the attention core, proj and the MLP's two matmuls."""
    T = lay.micro_batch * lay.local_seq
    mm = [Kernel(name, T, n, k) for name, k, n in _weights(model, lay)]
    steps = [[mm[0]], attention(model, lay, "F"), [mm[1]], [mm[2]], [mm[3]]]
    out: list[Kernel] = []
    for slot in range(len(steps) + 1):
        out += [Kernel(name, nbytes=n) for name, n, at in _passes(model, lay) if at == slot]
        out += steps[slot] if slot < len(steps) else []
    return out


# Bytes an FP8 cast moves per element, by scaling recipe (``--fp8-recipe``; Transformer Engine's kernels): each reads
# the 16-bit tensor and writes its FP8 copy in both layouts (the forward's and dX's GEMMs read one, dW's the
# transposed one: Hopper's FP8 GEMMs take only the "TN" layout), 2 + 1 + 1, and then
#   delayed    nothing more: the scale comes from the amax history, this tensor's amax is found in the same pass
#   current    the tensor read once more first, for the amax that scales it (2): a pass before the cast
#   blockwise  a float32 scale per 128 elements in each layout (1x128 tiles; 128x128 weight blocks: less), 2 * 4/128
#   mxfp8      an E8M0 scale per 32 elements in each layout, 2 * 1/32
FP8_CAST_BYTES = {"delayed": 2 + 1 + 1, "current": 2 + 2 + 1 + 1, "blockwise": 2 + 1 + 1 + 2 * 4 / 128,
                  "mxfp8": 2 + 1 + 1 + 2 * 1 / 32}


def fp8_casts(model: ModelSpec, lay: Layout) -> dict[str, list[Kernel]]:
    """What ``--dtype fp8`` adds to a layer a micro-batch (Transformer Engine's FP8 linears): each weight
    matmul's input cast to FP8 in the forward, [T, in], and its incoming gradient in the backward, [T, out], each
    ``FP8_CAST_BYTES[recipe]`` an element at HBM speed; its weight cast once a step, [in, out], a 1/m share in
    each micro-batch's forward (the first pays it all; the step is the same)."""
    if not lay.fp8:
        return {"F": [], "B": []}
    T, m, per = lay.micro_batch * lay.local_seq, lay.microbatches, FP8_CAST_BYTES[lay.fp8_recipe]
    weights = _weights(model, lay)
    return {"F": [Kernel(f"fp8_cast_{name}", nbytes=per * (T * k + k * n / m)) for name, k, n in weights],
            "B": [Kernel(f"d_fp8_cast_{name}", nbytes=per * T * n) for name, k, n in weights[::-1]]}


def layer(model: ModelSpec, lay: Layout, recompute: str | None = None) -> dict[str, list[Kernel]]:
    """``{"F", "B", "W"}``: one layer's kernels for one micro-batch on one GPU (the module docstring)."""
    recompute = lay.recompute if recompute is None else recompute
    T = lay.micro_batch * lay.local_seq
    casts = fp8_casts(model, lay)
    fwd = forward(model, lay) + casts["F"]
    redo = {"full": fwd, "selective": [] if flash(lay) else attention(model, lay, "F")}
    dx = [Kernel(f"d_{name}_input", T, k, n) for name, k, n in _weights(model, lay)[::-1]]
    passes = [Kernel(f"d_{name}", nbytes=2 * n) for name, n, _ in _passes(model, lay)]
    dw = [Kernel(f"d_{name}_weight", k, n, T) for name, k, n in _weights(model, lay)[::-1]]
    return {"F": fwd, "B": [*redo.get(recompute, []), *casts["B"], *dx, *passes, *attention(model, lay, "B")],
            "W": dw}


def head(model: ModelSpec, lay: Layout) -> dict[str, list[Kernel]]:
    """The LM head and the loss: the logits matmul [T, h]×[h, V/t], its dX and dW, and the vocab-parallel
    cross-entropy's passes over the float32 logits (Megatron: ``logits.float()``; read, write, softmax's max,
    sum and normalise: 4 passes of 4 bytes forward, 2 backward)."""
    T, v = lay.micro_batch * lay.local_seq, padded_vocab_size(model.vocab, lay.tp) // lay.tp
    logits = 4.0 * T * v
    return {"F": [Kernel("logits", T, v, model.hidden), Kernel("cross_entropy", nbytes=4 * logits)],
            "B": [Kernel("d_cross_entropy", nbytes=2 * logits), Kernel("d_logits_input", T, model.hidden, v)],
            "W": [Kernel("d_logits_weight", model.hidden, v, T)]}
