# %% [markdown]
# # Lesson 07 — Dropout masks and gradient clipping under tensor parallelism
#
# Runs on **4 ranks**: `mpirun -n 4 python lessons/07_dropout_rng_and_clipping.py`
# (or `tpsim lesson run 07`; as a notebook on as many engines: `tpsim lesson notebook 07`).
#
# Two pieces of training that look purely local hide a tensor-parallel question each:
#
# 1. **Dropout** draws random bits. Which ranks must draw the *same* bits, and which must draw *different* ones?
# 2. **Gradient clipping** needs the norm of *all* gradients. Shards are disjoint, but replicated parameters
#    sit on every rank — counted naively, they are counted p times.
#
# Both are the "extra handling" of §2.2.3 of the SenseParrots article; the answers below are Megatron-LM's.
#
# Sources: the SenseParrots article, §2.2.3; Shoeybi et al. 2019, "Megatron-LM", arXiv:1909.08053, §3 (its
# handling of the random number generators) and its code (`CudaRNGStatesTracker`, `clip_grad_norm`).

# %%
RANKS = 4

import numpy as np

from tpsim.comm import ProcessGrid
from tpsim.models.build import parallel_gpt, serial_gpt
from tpsim.arch.gpt2 import GPTConfig
from tpsim.nn import CausalSelfAttention, DropoutPlan
from tpsim.teach.runtime import Lesson, shard_error
from tpsim.tp import ExactDropoutRNG, MegatronDropoutRNG, ParallelSelfAttention
from tpsim.train import clip_grad_norm, grad_entries, grad_norm

lesson = Lesson("07", RANKS)
grid = ProcessGrid(tp=RANKS)
group, tracer = grid.tp_group, grid.tracer
SEED, P = 7, 0.3


def from_every_rank(mask: np.ndarray, axis: int) -> np.ndarray:
    """Every rank's mask, concatenated along ``axis`` in rank order, on every rank (bookkeeping: untraced)."""
    with tracer.paused():
        return group.all_gather(mask.astype(np.uint8), axis=axis).astype(bool)


# %% [markdown]
# ## Part 1 — dropout: same bits or different bits?
#
# * Dropout on a **replicated** activation — the residual stream `[b, s, h]`, held whole by every TP rank —
#   must drop the *same* elements on every rank. Otherwise the ranks' copies of the "same" tensor drift apart.
# * Dropout on a **partitioned** activation — attention probabilities `[b, heads, s, s]`, split by heads —
#   must drop *independent* elements on each shard; the same bits on every shard would correlate the heads.
#
# Megatron-LM keeps two generators per rank (its `CudaRNGStatesTracker`): a default one seeded alike on all
# TP ranks, used in replicated regions, and a model-parallel one seeded `seed + 2718 + tp_rank`, used in
# partitioned regions. tpsim has that scheme (`MegatronDropoutRNG`) and a second one, `ExactDropoutRNG`, in
# which an element's keep bit is a hash of (seed, site, step, *global position*): a rank holding a position
# gets the very bit the serial model draws for it, however the tensor is split.

# %%
lesson.section("Part 1 — dropout: same bits or different bits?")
b, s, h, heads = 2, 5, 8, 8
everything = (slice(None),) * 3
site = "transformer.h.0.mlp.dropout"
for scheme, rng in (("exact", ExactDropoutRNG(SEED)), ("Megatron", MegatronDropoutRNG(SEED, group.rank))):
    mask = rng.keep_mask(P, site, 0, (b, s, h), everything, region="replicated")
    every = from_every_rank(mask[None], axis=0)  # [ranks, b, s, h]
    lesson.expect(f"{scheme}: a replicated tensor gets the same mask on every TP rank, or the copies drift apart")
    lesson.equal(f"{scheme}: replicated region, every TP rank drops the same elements",
                 bool((every == every[0]).all()), True)

# %% [markdown]
# Now the partitioned case: rank r holds heads 2r and 2r+1 of the attention probabilities. With the exact
# scheme the shards, put side by side, *are* the serial model's mask. With Megatron's, each shard is a fresh
# draw from its own generator: different per rank as it must be, but not the serial mask.

# %%
shape = (b, heads, s, s)
my_heads = np.arange(heads).reshape(RANKS, -1)[group.rank]
index = (slice(None), my_heads, slice(None), slice(None))
site = "transformer.h.0.attn.attn_dropout"

exact_shard = ExactDropoutRNG(SEED).keep_mask(P, site, 0, shape, index, region="partitioned")
serial_exact = ExactDropoutRNG(SEED).keep_mask(P, site, 0, shape, (slice(None),) * 4, region="partitioned")
lesson.expect("exact: bits keyed by global position, so the shards side by side are the serial mask")
lesson.equal("exact: the shards side by side equal the serial mask", bool(np.array_equal(
    from_every_rank(exact_shard, axis=1), serial_exact)), True)
lesson.expect(f"about 1 − p = {1 - P:g} of the elements kept")
lesson.check("exact: the keep fraction is 1 − p", f"{serial_exact.mean():.3f} (1 − p = {1 - P})",
             abs(serial_exact.mean() - (1 - P)) < 0.06)

megatron_shard = MegatronDropoutRNG(SEED, group.rank).keep_mask(P, site, 0, shape, index, region="partitioned")
shards = from_every_rank(megatron_shard, axis=1).reshape(b, RANKS, -1, s, s)
pairs = float((shards[:, 0] == shards[:, 1]).mean())
lesson.expect("Megatron: each rank's own generator, so two shards agree only as often as independent draws do")
lesson.check("Megatron: rank 0's and rank 1's shards are independent draws (fraction of equal bits ≈ "
             f"p² + (1 − p)² = {P**2 + (1 - P)**2:.2f})", f"{pairs:.2f}", pairs < 0.9)
serial_megatron = MegatronDropoutRNG(SEED, 0).keep_mask(P, site, 0, shape, (slice(None),) * 4,
                                                        region="partitioned")
agree = float((shards.reshape(shape) == serial_megatron).mean())
lesson.expect("and the shards together are a different (equally valid) mask from the serial one")
lesson.check("Megatron: the shards are not the serial mask (fraction of equal bits ≈ p² + (1 − p)²)",
             f"{agree:.2f}", agree < 0.9)

# %% [markdown]
# Had the partitioned region used the *default* generator — seeded alike on every rank — every shard would
# get the same bits: heads 0, 2, 4 and 6 would all drop the same entries. That is the bug the second
# generator exists to prevent.

# %%
same_stream = MegatronDropoutRNG(SEED, group.rank).keep_mask(P, site, 0, shape, index, region="replicated")
every = from_every_rank(same_stream, axis=1).reshape(b, RANKS, -1, s, s)
lesson.expect("the default generator is seeded alike on every rank: every shard drops the same entries (the bug)")
lesson.equal("wrong generator: all 4 shards drop exactly the same elements",
             bool(all(np.array_equal(every[:, 0], every[:, r]) for r in range(RANKS))), True)

# %% [markdown]
# The consequence for a whole layer: with the exact scheme, tensor-parallel attention *with dropout* equals
# the serial layer bit for bit, so the "TP equals serial" test keeps working in training mode. With
# Megatron's scheme it is a different, equally valid dropout — tests must switch dropout off.

# %%
rng = np.random.default_rng(70)
x = rng.standard_normal((b, s, 16))
serial_attn = CausalSelfAttention(16, heads, rng=rng, std=0.3, attn_dropout=0.2).set_path("attn")
attn = ParallelSelfAttention.from_serial(serial_attn, group).set_path("attn")
y_exact = attn.forward(x, DropoutPlan(ExactDropoutRNG(SEED)))[0]
lesson.expect("exact RNG: TP attention with dropout equals serial to rounding; Megatron's: a different output")
lesson.close("exact RNG: parallel attention with dropout = serial", y_exact,
             serial_attn.forward(x, DropoutPlan(ExactDropoutRNG(SEED)))[0])
y_megatron = attn.forward(x, DropoutPlan(MegatronDropoutRNG(SEED, group.rank)))[0]
lesson.apart("Megatron RNG: parallel attention with dropout ≠ serial", y_megatron,
             serial_attn.forward(x, DropoutPlan(MegatronDropoutRNG(SEED, 0)))[0], 1e-3)

# %% [markdown]
# ## Part 2 — clipping: count every element once
#
# Clipping scales all gradients by `max_norm / ‖g‖` when the global norm `‖g‖ = sqrt(Σ g²)` exceeds
# `max_norm`. Under TP each rank holds two kinds of gradient:
#
# * **shards** (a `Partition` in tpsim): disjoint slices — summing every rank's `Σ g²` counts each element once;
# * **replicated** parameters (LayerNorms, the position embedding, row-parallel biases): the *same* full
#   gradient on every rank — summed over the ranks they are counted p times.
#
# So, as in Megatron, only TP rank 0 adds the replicated ones; one all-reduce of a single number combines the
# ranks. We check it on a one-layer GPT against the serial model's norm.

# %%
lesson.section("Part 2 — clipping: count every element once")
config = GPTConfig(vocab_size=13, n_positions=8, n_embd=16, n_layer=1, n_head=4)
serial = serial_gpt(config, seed=3)
model = parallel_gpt(serial, group)
data = np.random.default_rng(71)
ids, labels = data.integers(0, 13, size=(2, 6)), data.integers(0, 13, size=(2, 6))
loss_serial = serial.loss_and_grads(ids, labels)
loss = model.loss_and_grads(ids, labels)
lesson.expect("the TP GPT is the serial GPT split up: the same loss")
lesson.close("the TP GPT's loss equals the serial loss", loss, loss_serial)

entries = grad_entries(model)
replicated = [name for name, _, part in entries if part is None]
lesson.say(f"{len(replicated)} of {len(entries)} parameters are replicated: {', '.join(replicated)}", "")
true_norm = float(np.sqrt(sum(np.sum(g * g) for _, g in serial.named_grads())))

tracer.reset()
norm = grad_norm(model, group)
lesson.expect("the TP-aware norm is the serial norm, for one all-reduce of a single number")
lesson.close(f"TP-aware norm vs the serial norm {true_norm:.6f}", norm, true_norm)
lesson.equal("its communication: (op, shape) of every collective", [(e.op, e.shape) for e in tracer.events],
             [("all_reduce", (1,))])

with tracer.paused():
    local = sum(float(np.sum(g * g)) for _, g, _ in entries)  # every rank counts everything it holds
    naive = float(np.sqrt(group.all_reduce(np.array([local]))[0]))
replicated_sq = sum(float(np.sum(g * g)) for _, g, part in entries if part is None)
lesson.expect("counting everything on every rank counts each replicated gradient p times: too large, by exactly "
              "(p − 1) · their Σ g²")
lesson.apart(f"the naive norm {naive:.6f} is too large", naive, true_norm, 1e-4)
lesson.close("naive² − true² = (p − 1) · Σ (replicated gradients)²", naive**2 - true_norm**2,
             (RANKS - 1) * replicated_sq)

# %% [markdown]
# Clipping with the right norm scales every shard by the serial coefficient, so the clipped TP gradients are
# still slices of the clipped serial gradients. The naive norm would have clipped by a smaller coefficient.

# %%
max_norm = true_norm / 2
before = clip_grad_norm(model, group, max_norm)
coef = max_norm / (true_norm + 1e-6)  # PyTorch's rule, which tpsim follows
clipped_serial = {name: coef * g for name, g in serial.named_grads()}
lesson.expect("the right norm scales every shard by the serial coefficient; the naive one would scale harder")
lesson.close("clipped gradient shards vs the clipped serial gradients", shard_error(model, clipped_serial), 0.0)
lesson.close(f"norm after clipping = coefficient × norm before ≈ max_norm {max_norm:.6f}", grad_norm(model, group),
             coef * before)
lesson.check("the naive norm would clip harder", f"coefficient {max_norm / (naive + 1e-6):.4f} instead of "
             f"{coef:.4f}", max_norm / (naive + 1e-6) < coef)

# %% [markdown]
# ## What to take away
#
# * Replicated activations need the same dropout bits on every TP rank; partitioned ones need independent bits.
#   Keying bits by global position (the exact scheme) gives both, and keeps TP equal to serial.
# * The global gradient norm is one all-reduce of one number — with replicated gradients counted by one rank.
#
# Exercise: combine the norm in `ex07_dropout_rng_and_clipping.py`: `tpsim lesson start 07` copies it into your work
# folder (`tpsim-work/`), then `tpsim check 07`.

# %%
lesson.takeaways()
lesson.finish()
