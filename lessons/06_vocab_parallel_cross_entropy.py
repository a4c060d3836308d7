# %% [markdown]
# # Lesson 06 — Vocab-parallel cross-entropy: the loss without the logits
#
# Runs on **4 ranks**: `mpirun -n 4 python lessons/06_vocab_parallel_cross_entropy.py`
# (or `tpsim lesson run 06`; as a notebook on as many engines: `tpsim lesson notebook 06`).
#
# The output layer of a language model turns each token's hidden state into one logit per vocabulary entry:
# `[tokens, V]`, with V = 50257 for GPT-2. Megatron splits this layer by vocabulary (a column-parallel
# linear tied to the embedding), so rank r ends up holding the logits `z_r: [tokens, V/p]` of its slice of
# the vocabulary. The obvious next step — all-gather the logits and run the ordinary softmax cross-entropy —
# would move the largest activation of the whole model. Equations (3) and (4) of the SenseParrots article
# (§2.2.2 there) avoid it.
#
# Sources: the SenseParrots article, eqs. (3) and (4) and its §2.2.2; Shoeybi et al. 2019, "Megatron-LM",
# arXiv:1909.08053, §3 (the vocab-parallel output layer and its cross-entropy).

# %%
RANKS = 4

import numpy as np

from tpsim.comm import ProcessGrid
from tpsim.cost import wire_bytes
from tpsim.nn import softmax_cross_entropy_backward, softmax_cross_entropy_forward
from tpsim.teach.runtime import Lesson, table
from tpsim.tp import VocabParallelCrossEntropy, padded_vocab_size, vocab_range
from tpsim.table import human_bytes

lesson = Lesson("06", RANKS)
grid = ProcessGrid(tp=RANKS)
group, tracer = grid.tp_group, grid.tracer

# %% [markdown]
# ## Three numbers per token
#
# For one token with logits `z` and target `t`, the loss is `log Σ_c exp(z_c) − z_t`. Subtracting the
# largest logit `m` keeps every exponent ≤ 0, so nothing overflows even for logits in the thousands. With
# the vocabulary split over ranks r (the SenseParrots article's equations, same numbers):
#
#     (4)  m = max_r max_{c on r} z_c                the global max is the max of the ranks' maxima
#     (3)  S = Σ_r Σ_{c on r} exp(z_c − m)           the global sum is the sum of the ranks' sums
#          loss = m + log S − z_t                    z_t from the rank that holds column t
#
# Each of `m`, `S` and `z_t` is a reduction over the vocabulary, so each is *one all-reduce of `[tokens]`
# numbers*: MAX of the ranks' local maxima; SUM of the local sums of `exp(z − m)` (after `m` is known);
# SUM of the target logit, which its owner contributes and every other rank sends as 0.
#
# The loss of a batch is the *mean* over its N tokens, so the backward is
#
#     ∂loss/∂z_c = (softmax_c − onehot_c) / N,      softmax_c = exp(z_c − m) / S
#
# and it needs no communication at all: every rank has `m` and `S`, and its own columns of `z` and of the
# one-hot target. Nor does the max all-reduce need a backward. `m` is only a shift: for *any* constant c,
# `c + log Σ exp(z − c)` is the same number, so the loss does not change when `m` does — its derivative
# with respect to `m` is `1 − Σ_c exp(z_c − m)/S = 1 − 1 = 0`. The gradient that would flow through the max
# cancels exactly; Megatron takes the max of detached logits for that reason.
#
# V = 50 does not divide by 4, so the vocabulary is padded to `Vp = 52` and the last rank holds two padding
# columns. We fill them with 10⁴ to show that they never enter the max, the sum or the gradient.

# %%
rng = np.random.default_rng(6)  # the same master logits and targets on every rank
tokens, vocab = 6, 50
padded = padded_vocab_size(vocab, RANKS)
start, end = vocab_range(padded, RANKS, group.rank)
targets = rng.integers(0, vocab, size=tokens)
lesson.say(f"V = {vocab}, padded to Vp = {padded}; this rank (rank 0) holds columns [{start}, {end})", "")


def local_logits(master: np.ndarray) -> np.ndarray:
    """This rank's columns of the master logits, padding columns filled with 1e4."""
    full = np.pad(master, ((0, 0), (0, padded - vocab)), constant_values=1e4)
    return np.ascontiguousarray(full[:, start:end])


loss_fn = VocabParallelCrossEntropy(group, vocab_size=vocab, vocab_start=start).set_path("loss")
lesson.section("Three numbers per token")
for scale in (1.0, 1000.0):
    master = scale * rng.standard_normal((tokens, vocab))
    tracer.reset()
    loss, cache = loss_fn.forward(local_logits(master), targets)
    dz = loss_fn.backward(1.0, cache)
    loss_ref, ref_cache = softmax_cross_entropy_forward(master, targets)
    dz_ref = np.pad(softmax_cross_entropy_backward(1.0, ref_cache), ((0, 0), (0, padded - vocab)))
    lesson.expect(f"logits ×{scale:g}: the serial loss and this rank's columns of its gradient, to rounding"
                  + (" — the max keeps exp finite" if scale > 1 else ""))
    lesson.close(f"logits ×{scale:g}: |loss − serial loss| (serial {loss_ref:.6g})", loss, loss_ref, tol=1e-12 * scale)
    lesson.close(f"logits ×{scale:g}: max |∂loss/∂z_r − serial gradient's columns| (padding: exactly 0)",
                 dz, dz_ref[:, start:end])
    if scale == 1.0:  # spread-out probabilities: the clearest case for the gradient by hand below
        moderate, dz_moderate = master, dz

# %% [markdown]
# The gradient by hand, from the formula above — and the max's missing backward, as a number: shift the
# logits by another constant than `m` and the loss stays put.

# %%
shifted = moderate - moderate.max(axis=1, keepdims=True)
softmax = np.exp(shifted) / np.exp(shifted).sum(axis=1, keepdims=True)
onehot = np.eye(vocab)[targets]
by_hand = np.pad((softmax - onehot) / tokens, ((0, 0), (0, padded - vocab)))[:, start:end]
lesson.expect(f"(softmax − onehot) / N with N = {tokens} tokens: this rank's gradient columns, to rounding")
lesson.close("logits ×1: max |(softmax − onehot)/N − ∂loss/∂z_r| (this rank's columns)", by_hand, dz_moderate)
lesson.expect("without the 1/N of the mean the gradient is N times too large")
lesson.apart("logits ×1: max |(softmax − onehot) − ∂loss/∂z_r|", by_hand * tokens, dz_moderate, 1e-3)


def loss_shifted_by(c: np.ndarray) -> float:
    """The mean cross-entropy computed with the shift ``c`` (one per token) in place of the max."""
    return float(np.mean(c + np.log(np.exp(master - c[:, None]).sum(axis=1)) - master[np.arange(tokens), targets]))


m = master.max(axis=1)
lesson.expect("the loss does not depend on the shift (so ∂loss/∂m = 0 and the max needs no backward); "
              "shifts of ±100 on logits ×1000")
lesson.close("max |loss(shift m ± 100) − loss(shift m)|",
             np.array([loss_shifted_by(m + 100), loss_shifted_by(m - 100)]), np.full(2, loss_shifted_by(m)), tol=1e-9)

# %% [markdown]
# ## What moved
#
# The trace of that last forward and backward should hold exactly three all-reduces of `[tokens]` and
# nothing else. For comparison we then gather the logits for real, the way the naive approach would.

# %%
lesson.section("What moved")
shapes = [(e.phase, e.op, e.reduce_op, tuple(e.shape)) for e in tracer.events]
lesson.expect("three [tokens] all-reduces forward (max, sum, target logit) and nothing in the backward")
lesson.equal("collectives of the loss (phase, op, reduction, shape)", shapes,
             [("forward", "all_reduce", "max", (tokens,)), ("forward", "all_reduce", "sum", (tokens,)),
              ("forward", "all_reduce", "sum", (tokens,))])
ce_bytes, ce_wire = sum(e.bytes for e in tracer.events), sum(e.wire_bytes for e in tracer.events)
lesson.expect("3 · tokens numbers of 8 bytes: the loss's whole traffic")
lesson.equal("bytes of the three all-reduces = 3 · tokens · 8", ce_bytes, 3 * tokens * 8)

tracer.reset()
with tracer.region(scope="naive", phase="forward"):
    gathered = group.all_gather(local_logits(master), axis=-1)  # [tokens, Vp] on every rank
gather_bytes, gather_wire = sum(e.bytes for e in tracer.events), sum(e.wire_bytes for e in tracer.events)
lesson.expect("the gathered logits are tokens · Vp numbers")
lesson.equal("bytes of gathering the logits = tokens · Vp · 8", gather_bytes, tokens * padded * 8)
lesson.expect(f"logical ratio Vp/3 = {padded / 3:.3f}; on the wire Vp/6 = {padded / 6:.3f}, since an all-gather "
              "sends (p−1)/p of its output and an all-reduce 2(p−1)/p of its buffer")
lesson.equal("ratio gather / vocab-parallel (measured): (logical bytes, wire bytes)",
             (round(gather_bytes / ce_bytes, 3), round(gather_wire / ce_wire, 3)), (round(padded / 3, 3),
                                                                                    round(padded / 6, 3)))

# %% [markdown]
# Here the logical ratio is a modest 17. It is `Vp / 3` whatever the number of tokens, because both sides
# scale with them — so it is about 16 750 for GPT-2's vocabulary. What a rank *sends* is half that ratio,
# `Vp / 6`: the ring all-gather sends `(p−1)/p` of the gathered logits, while each of the three all-reduces
# sends `2(p−1)/p` of its `[tokens]` buffer (lesson 11 derives both). With the formulas of `tpsim.cost`, for
# a realistic step (8 sequences of 1024 tokens, float32, 8 ranks):

# %%
rows = [["vocabulary", "vocab-parallel CE", "gather the logits", "ratio", "wire: CE", "wire: gather",
         "wire ratio"]]
n_tokens, itemsize, p = 8 * 1024, 4, 8
for v in (50, 32000, 50257, 128256):
    vp = padded_vocab_size(v, p)
    ce, naive = 3 * n_tokens * itemsize, n_tokens * vp * itemsize
    ce_w, naive_w = 3 * wire_bytes("all_reduce", n_tokens * itemsize, p), wire_bytes("all_gather", naive, p)
    rows.append([f"{v:,}", human_bytes(ce), human_bytes(naive), f"{naive / ce:,.0f}", human_bytes(ce_w),
                 human_bytes(naive_w), f"{naive_w / ce_w:,.0f}"])
lesson.say(table(rows), "")
gpt2 = padded_vocab_size(50257, p)
gpt2_wire = wire_bytes("all_gather", n_tokens * gpt2 * 8, p) / (3 * wire_bytes("all_reduce", n_tokens * 8, p))
lesson.expect("Vp/3 logical and Vp/6 on the wire, for GPT-2's padded vocabulary")
lesson.equal("GPT-2 (Vp = 50264 at 8 ranks): (bytes ratio, wire ratio)",
             (round(n_tokens * gpt2 / (3 * n_tokens)), round(gpt2_wire)), (16755, 8377))

# %%
if lesson.rank == 0:
    plt = lesson.pyplot()
    vs = np.logspace(1, 5.3, 60)
    fig, ax = plt.subplots(figsize=(6, 3.6))
    ax.loglog(vs, [n_tokens * padded_vocab_size(int(v), p) * itemsize for v in vs], label="all-gather the logits")
    ax.loglog(vs, [3 * n_tokens * itemsize] * len(vs), label="vocab-parallel CE (3 all-reduces)")
    ax.axvline(50257, color="grey", linestyle=":", label="GPT-2's V")
    ax.set_xlabel("vocabulary size V")
    ax.set_ylabel("bytes per step (8 × 1024 tokens, fp32)")
    ax.set_title("cross-entropy communication")
    ax.grid(alpha=0.3, which="both")
    ax.legend()
    fig.tight_layout()
    lesson.save(fig, "06_ce_bytes.png")

# %% [markdown]
# ## What to take away
#
# * The loss of vocab-split logits needs three `[tokens]` all-reduces: max, sum of exponentials, target logit.
# * Subtracting the global max first keeps `exp` finite for any logits; padding columns are simply left out.
# * The backward, `(softmax − onehot)/N`, is local, and the max needs none: the loss is invariant to the shift.
#   The `[tokens, V]` logits — the largest activation — never cross the network: `Vp/3` fewer logical bytes
#   than gathering them, `Vp/6` fewer on the wire.
#
# Exercise: the three reductions in `ex06_vocab_parallel_cross_entropy.py`: `tpsim lesson start 06` copies it into
# your work folder (`tpsim-work/`), then `tpsim check 06`.

# %%
lesson.takeaways()
lesson.finish()
