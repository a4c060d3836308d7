# %% [markdown]
# # Lesson 15 — Mixed precision under TP
#
# Runs on **4 ranks**: `mpirun -n 4 python lessons/15_mixed_precision.py` (or `tpsim lesson run 15`;
# as a notebook on as many engines: `tpsim lesson notebook 15`).
#
# Real Megatron runs train in 16 bits: bfloat16 (or float16) parameters and activations, float32 "main"
# gradients and parameters in the optimizer (Micikevicius et al. 2017). Tensor parallelism then moves 2-byte
# activations — half the bytes — but it also adds partial results in a different order than one device would,
# and in 16 bits the order shows. This lesson rounds to bfloat16 by hand, watches a 2-byte all-reduce, measures
# how far TP in bfloat16 is from serial in bfloat16 (and that float32 sums across TP remove it), and runs the
# loss scaler that float16 needs.
#
# Sources: Micikevicius et al. 2017, "Mixed Precision Training", arXiv:1710.03740 (§3: float32 master weights,
# loss scaling); Shoeybi et al. 2019, "Megatron-LM", arXiv:1909.08053, §3 (where TP's all-reduces sit); the
# SenseParrots article, eq. (2) (the row-parallel split: a sum of partial products).

# %%
RANKS = 4

import numpy as np

from tpsim.comm import ProcessGrid
from tpsim.compare import shard_differences
from tpsim.models.build import build_gpt, serial_gpt
from tpsim.arch.gpt2 import GPTConfig
from tpsim.nn.precision import bfloat16
from tpsim.teach.runtime import Lesson
from tpsim.figures.drift import fp32_sums
from tpsim.train.loss_scale import DynamicLossScaler

lesson = Lesson("15", RANKS)
grid = ProcessGrid(tp=RANKS)
group, tracer = grid.tp_group, grid.tracer

# %% [markdown]
# ## bfloat16: 8 significand bits, rounded to nearest even
#
# bfloat16 is the top half of a float32: the same sign and 8 exponent bits (so the same range), but only 7
# fraction bits. The spacing of numbers just above 1 is 2^-7, and rounding to nearest makes an error of at most
# half of that: the **unit roundoff u = 2^-8 ≈ 0.4 %** (float16: 10 fraction bits, u = 2^-11, but a range that
# ends at 65504). A value exactly halfway goes to the neighbour whose last bit is 0 ("ties to even"), so
# rounding errors do not drift one way.

# %%
lesson.section("bfloat16: 8 significand bits, rounded to nearest even")
ulp = 2.0 ** -7
halfway = np.array([1 + ulp / 2, 1 + 3 * ulp / 2], np.float32)
lesson.expect("1 + ulp/2 goes down to 1 (even), 1 + 3·ulp/2 goes up to 1 + 2·ulp (even)")
lesson.equal("bfloat16(1 + ulp/2), bfloat16(1 + 3·ulp/2), in units of ulp above 1",
             tuple(((halfway.astype(bfloat16).astype(np.float64) - 1) / ulp).tolist()), (0.0, 2.0))
x = np.random.default_rng(0).standard_normal(100_000).astype(np.float32)
rel = np.abs(x.astype(bfloat16).astype(np.float64) - x) / np.abs(x)
lesson.expect("every relative rounding error is at most u = 2^-8 = 0.0039")
lesson.check("max relative error of 100 000 float32 → bfloat16 casts", f"{rel.max():.5f}", rel.max() <= 2.0 ** -8)

# %% [markdown]
# ## Half the bytes on the wire
#
# A bfloat16 tensor crosses the wire as 2 bytes per element. MPI has no bfloat16, so tpsim sends the bit
# patterns and reduces them with its own operation: cast both operands up to float32, add, round back — at
# every combining step, as a GPU's all-reduce kernel does. Each rank's value is then summed with up to p − 1
# roundings, each off by at most u of the partial sum.

# %%
lesson.section("Half the bytes on the wire")
mine = np.random.default_rng([15, grid.rank]).standard_normal((8, 64)).astype(bfloat16)
tracer.reset()
total = group.all_reduce(mine)
rec = tracer.events[-1]
lesson.expect("dtype bfloat16 and 2 bytes per element: 8 × 64 × 2 = 1024 bytes")
lesson.equal("traced dtype and bytes of a [8, 64] bfloat16 all-reduce", (rec.dtype, rec.bytes), ("bfloat16", 1024))
everyone = lesson.gather(mine.astype(np.float64))
exact = np.zeros((8, 64)) if everyone is None else sum(everyone)
bound = 0.0 if everyone is None else float(np.max((RANKS - 1) * 2.0 ** -8 * sum(np.abs(v) for v in everyone)))
err = 0.0 if everyone is None else float(np.max(np.abs(total.astype(np.float64) - exact)))
lesson.expect("the 16-bit sum is off the exact float64 sum by less than (p − 1)·u·Σ|x|")
lesson.check("max |bfloat16 all-reduce − float64 sum| vs the bound", f"{err:.3g} ≤ {bound:.3g}", err <= bound)

# %% [markdown]
# ## TP in 16 bits is not serial in 16 bits
#
# The serial model multiplies `Y·B` with one float32 accumulation and rounds once. Row-parallel TP computes
# `Y1·B1`, …, `Y4·B4`, rounds each to bfloat16, and the all-reduce adds them — rounding again. Same numbers,
# different roundings: the gradients of TP and serial differ by a few u. In float64 they agree to ~1e-15. And if
# the TP sums keep their partials in float32 and round once after the all-reduce (the study switch of
# `tpsim.figures.drift`), the difference is gone: the summation order in 16 bits was all of it.

# %%
lesson.section("TP in 16 bits is not serial in 16 bits")
cfg = GPTConfig(vocab_size=16, n_positions=8, n_embd=32, n_layer=2, n_head=4)
ids, labels = np.random.default_rng(3).integers(0, 16, (2, 4, 8))


def step0_difference(dtype, site=None) -> float:
    serial = serial_gpt(cfg, seed=1, dtype=dtype)
    serial.loss_and_grads(ids, labels)
    model = build_gpt(cfg, group, seed=1, dtype=dtype)
    with tracer.paused(), fp32_sums(site, dtype):
        model.loss_and_grads(ids, labels)
    return max(shard_differences(model, dict(serial.named_grads()), floor=1e-30).values())


d64, d16, d16_fp32 = step0_difference(np.float64), step0_difference(bfloat16), step0_difference(bfloat16, "both")
lesson.expect("float64: rounding level; bfloat16: a few u (u = 0.0039); bfloat16 with float32 TP sums: tiny")
lesson.check("max relative |Δgrad| TP 4 vs serial: float64, bfloat16, bfloat16 + float32 TP sums",
             f"{d64:.1e}, {d16:.1e}, {d16_fp32:.1e}", d64 < 1e-12 and 1e-4 < d16 < 5e-2 and d16_fp32 < 1e-4)

# %% [markdown]
# ## float16 needs loss scaling
#
# float16's smallest normal number is 6.1e-5 (subnormals reach 6e-8): small gradients vanish. The fix is to
# multiply the loss by a scale S (2^16 to start) so the backward's numbers are S times larger, divide the float32
# main gradients by S before the update, and adapt S: an inf or NaN anywhere → skip the step and halve S; 1000
# clean steps in a row → double S. bfloat16 has float32's range and needs none of this. The overflow flag must be
# agreed by every rank (one all-reduce over TP and DP), or the replicas would skip different steps.

# %%
lesson.section("float16 needs loss scaling")
tiny = np.float32(1e-8)
lesson.expect("1e-8 is 0 in float16, but 1e-8 × 2^16 survives and divides back in float32")
survived = float(np.float16(tiny * 2 ** 16).astype(np.float32) / 2 ** 16)
lesson.check("float16(1e-8), float16(1e-8 · 2^16) / 2^16", f"{float(np.float16(tiny)):.1e}, {survived:.2e}",
             np.float16(tiny) == 0 and abs(survived - 1e-8) < 1e-9)
scaler = DynamicLossScaler(growth_interval=3)
history = []
for found_inf in (False, True, False, False, False):
    scaler.update(found_inf)
    history.append(int(np.log2(scaler.scale)))
lesson.expect("clean → 16, overflow → 15 (the step skipped), then 3 clean steps → 16 again")
lesson.equal("log2(scale) after clean, inf, clean, clean, clean (growth interval 3)", history, [16, 15, 15, 15, 16])

# %% [markdown]
# ## The drift over training
#
# One step's difference of a few u does not stay small: training is chaotic, so TP's and serial's 16-bit
# trajectories separate over hundreds of steps, while both still learn. `figures/drift.png` (`make figures`,
# `python -m tpsim.figures.drift`) trains the demo's GPT at TP 1, 2, 4 in float64, float32, bfloat16 and
# float16: float64 stays at ~1e-15, float32 at ~1e-6, the 16-bit dtypes drift to ~1e-3 in the loss; the README
# section "Why the loss changes with TP" has the numbers.

# %%
lesson.section("The drift over training")
lesson.say("see figures/drift.png and the README section \"Why the loss changes with TP\"")

# %% [markdown]
# ## What to take away
#
# * bfloat16 keeps float32's range with 8 significand bits: each rounding is off by at most u = 2^-8.
# * TP's activations cross the wire in 2 bytes; the sums accumulate in float32 and round at every step.
# * TP in 16 bits differs from serial in 16 bits by a few u, only because it adds rounded partials in another
#   order; float32 TP sums remove it, and float64 shows none.
# * float16 needs dynamic loss scaling (skip and halve on overflow, double after clean steps), agreed by every
#   rank; bfloat16 does not.
#
# Exercise: `lessons/exercises/ex15_mixed_precision.py`, then `tpsim check 15`.

# %%
lesson.takeaways()
lesson.finish()
