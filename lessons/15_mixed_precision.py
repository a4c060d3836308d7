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
# how far TP in bfloat16 is from serial in bfloat16 (and that float32 sums across TP remove it at step 0, though
# not over training), runs the loss scaler that float16 needs, and reads the drift study's numbers.
#
# Sources: Micikevicius et al. 2017, "Mixed Precision Training", arXiv:1710.03740 (§3: float32 master weights,
# loss scaling); Shoeybi et al. 2019, "Megatron-LM", arXiv:1909.08053, §3 (where TP's all-reduces sit), and
# Megatron-LM's `--initial-loss-scale`, `--loss-scale-window`, `--hysteresis` defaults; PyTorch's
# `torch.amp.GradScaler` (its `init_scale` 2^16); the SenseParrots article, eq. (2) (the row-parallel split: a
# sum of partial products).

# %%
RANKS = 4

import json
import shutil

import numpy as np

from tpsim.comm import ProcessGrid
from tpsim.compare import shard_differences
from tpsim.models.build import build_gpt, serial_gpt
from tpsim.arch.gpt2 import GPTConfig
from tpsim.nn.precision import bfloat16
from tpsim.teach.lessons import figures_dir
from tpsim.teach.notebook import show_inline
from tpsim.teach.runtime import Lesson, table
from tpsim.figures.drift import CURVES, fp32_sums
from tpsim.train import AdamW, apply_update, compute_grads, mixed_precision
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
# `tpsim.figures.drift`), the step-0 difference is gone: at step 0 the summation order in 16 bits was all of
# it. Not over training, though: the 16-bit parameters round what is left into a whole ulp now and then, and
# training amplifies it like any other difference (the last section has the numbers).

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
# multiply the loss by a scale S so the backward's numbers are S times larger, divide the float32 main gradients
# by S before the update, and adapt S. tpsim's scaler starts at S = 2^16, as PyTorch's `GradScaler` does; an
# inf or NaN anywhere → skip the step and halve S (never below a floor, 1); `growth_interval` clean steps in a
# row (1000 by default, Megatron's window) → double S. Megatron-LM's own defaults differ: it starts at
# `--initial-loss-scale` 2^32, grows after `--loss-scale-window` 1000 clean steps, and with `--hysteresis` 2 halves
# S only at the second overflow (every overflow still skips its step). bfloat16 has float32's range and needs
# none of this. The overflow flag must be agreed by every rank (one all-reduce over TP and DP), or the replicas
# would skip different steps. Below, a float16 GPT under TP 4 trains five steps with a growth interval of 3; at
# the second step one rank's gradient gets an inf.

# %%
lesson.section("float16 needs loss scaling")
tiny = np.float32(1e-8)
lesson.expect("1e-8 is 0 in float16, but 1e-8 × 2^16 survives and divides back in float32")
survived = float(np.float16(tiny * 2 ** 16).astype(np.float32) / 2 ** 16)
lesson.check("float16(1e-8), float16(1e-8 · 2^16) / 2^16", f"{float(np.float16(tiny)):.1e}, {survived:.2e}",
             np.float16(tiny) == 0 and abs(survived - 1e-8) < 1e-9)
defaults = DynamicLossScaler()
lesson.expect("tpsim's scaler defaults: S = 2^16 (GradScaler's), ×2 after 1000 clean steps, ×0.5 on overflow, "
              "floor 1")
lesson.equal("DynamicLossScaler(): log2(scale), growth_interval, growth, backoff, min_scale",
             (int(np.log2(defaults.scale)), defaults.growth_interval, defaults.growth_factor, defaults.backoff_factor,
              defaults.min_scale), (16, 1000, 2.0, 0.5, 1.0))
fp16 = build_gpt(cfg, group, seed=1, dtype=np.float16)
opt = mixed_precision(fp16, lambda m: AdamW(m, lr=1e-3), grid.world, loss_scaler=DynamicLossScaler(growth_interval=3))
POISONED = (False, True, False, False, False)  # the steps at which rank RANKS − 1 finds an inf
history, skipped, changed, agreed = [], [], [], []
for poisoned in POISONED:
    before = [p.copy() for _, p in fp16.named_parameters()]
    compute_grads(fp16, grid, None, ids, labels, loss_scale=opt.loss_scale)
    if poisoned and grid.rank == RANKS - 1:  # one rank's gradient only: the others must learn of it
        next(iter(dict(fp16.named_grads()).values())).flat[0] = np.inf
    tracer.reset()
    apply_update(fp16, opt, grid, clip=1.0)
    agreed.append(sum(e.scope == "loss_scaler" and e.group == "world" for e in tracer.events))
    history.append(int(np.log2(opt.loss_scaler.scale)))
    skipped.append(opt.skipped)
    changed.append(any(not np.array_equal(b, p) for b, (_, p) in zip(before, fp16.named_parameters())))
lesson.say(table([["step", "inf on a rank", "log2(scale) after", "skipped", "parameters changed"]] +
                 [[str(i), f"rank {RANKS - 1}" if bad else "-", str(h), str(k), str(c)]
                  for i, (bad, h, k, c) in enumerate(zip(POISONED, history, skipped, changed))]), "")
lesson.expect("clean → 16, overflow → 15 and the step skipped on every rank, then 3 clean steps → 16 again")
lesson.equal("log2(scale) after clean, inf, clean, clean, clean (growth interval 3)", history, [16, 15, 15, 15, 16])
lesson.equal("skipped, per step (the same on every rank)", skipped, [False, True, False, False, False])
lesson.expect("the skipped step leaves every parameter as it was; the clean ones update; one found-inf all-reduce "
              "over the world per step")
lesson.equal("parameters changed, per step", changed, [True, False, True, True, True])
lesson.equal("found-inf all-reduces over the world, per step", agreed, [1] * 5)

# %% [markdown]
# ## The drift over training
#
# One step's difference of a few u does not stay small: training is chaotic, so TP's and serial's 16-bit
# trajectories separate over hundreds of steps, while both still learn. The drift study (`make figures`, or
# `mpiexec -n 4 python -m tpsim.figures.drift`) trains the demo's GPT for 200 steps at TP 1, 2, 4 in float64,
# float32, bfloat16 and float16, and commits its numbers with its figure (`figures/drift.json`, the losses per step
# in `figures/drift_curves.json`, the figure `figures/drift.png`; docs/guide/mixed-precision.md, "Why the loss
# changes with TP"). Read here: |Δloss| against the serial model in the same dtype peaks between steps 30 and 70,
# where the loss falls fastest (float32 ~1e-4, the 16-bit dtypes ~5e-2), and settles by the end (mean of the last
# 20 steps) at ~2e-7 in float32 and ~1e-4 in 16 bits; float64 stays at rounding level. bfloat16 TP 4 with both
# kinds of TP sum in float32 starts at 1.4e-6, and yet ends *above* plain bfloat16 TP 4: float32 sums remove the
# difference at step 0 only.

# %%
lesson.section("The drift over training")
figures = figures_dir()  # the repository's figures/ (installed with the package as tpsim/lessons/figures/)
study = json.loads((figures / "drift.json").read_text())
summary, steps = study["summary"], study["steps"]
curves = {key: np.array(loss) for key, loss in json.loads((figures / CURVES).read_text()).items()}


def gap(key: str) -> np.ndarray:
    """|loss(run) − loss(serial)| per step, in the run's dtype."""
    return np.abs(curves[key] - curves[f"tp1 {key.split()[1]}"])


dtypes = ("float64", "float32", "bfloat16", "float16")
runs = [f"tp{t} {d}" for d in dtypes for t in (2, 4)] + ["tp4 bfloat16 fp32 at both"]
rows = [["run (vs serial, same dtype)", "step-0 |Δgrad|", "peak |Δloss|", "at step", "|Δloss|, last 20",
         "final loss"]]
rows += [[key.replace("tp", "TP ", 1).replace(" fp32 at both", " + fp32 TP sums"),
          f"{summary[key]['step0_grad_difference']:.1e}", f"{gap(key).max():.1e}", str(int(gap(key).argmax())),
          f"{summary[key]['vs_serial_same_dtype']:.1e}", f"{summary[key]['final_loss']:.4f}"] for key in runs]
lesson.say(f"figures/drift.json and {CURVES} ({steps} steps):", table(rows), "")
if lesson.rank == 0:  # the study's figure beside this run's output (and on the lesson's book page)
    lesson.out.mkdir(parents=True, exist_ok=True)
    copy = lesson.out / "15_drift.png"
    shutil.copyfile(figures / "drift.png", copy)
    lesson.say(f"wrote {copy} (a copy of figures/drift.png)", "")
    if lesson.notebook:
        show_inline(copy)
again = [abs(float(np.mean(gap(key)[-20:])) - summary[key]["vs_serial_same_dtype"]) for key in runs]
lesson.expect("the curves are the summary's run: the mean of their last 20 steps is drift.json's number")
lesson.check("|mean of the last 20 |Δloss| − drift.json's|, worst run", f"{max(again):.1e}", max(again) == 0.0)
end = {d: [summary[f"tp{t} {d}"]["vs_serial_same_dtype"] for t in (2, 4)] for d in dtypes}
peak = {d: [float(gap(f"tp{t} {d}").max()) for t in (2, 4)] for d in dtypes}
at = [int(gap(f"tp{t} {d}").argmax()) for d in ("float32", "bfloat16", "float16") for t in (2, 4)]
lesson.expect("peaks between steps 30 and 70: float32 within 5e-5..2e-4 (~1e-4), 16 bits within 2e-2..1e-1 (~5e-2)")
half = peak["bfloat16"] + peak["float16"]
lesson.check("the peaks", f"float32 {peak['float32'][0]:.1e}, {peak['float32'][1]:.1e}; 16-bit "
             f"{min(half):.1e}..{max(half):.1e}; steps {min(at)}..{max(at)}",
             all(5e-5 < v < 2e-4 for v in peak["float32"]) and all(2e-2 < v < 1e-1 for v in half)
             and 30 <= min(at) <= max(at) <= 70)
lesson.expect("at the end: float64 below 1e-14, float32 within 1e-7..1e-6 (~2e-7), 16 bits within 1e-4..1e-3 (~1e-4)")
lesson.check("mean |Δloss| over the last 20 steps, TP 2 and TP 4",
             "; ".join(f"{d} {a:.1e}, {b:.1e}" for d, (a, b) in end.items()),
             all(v < 1e-14 for v in end["float64"]) and all(1e-7 < v < 1e-6 for v in end["float32"])
             and all(1e-4 < v < 1e-3 for v in end["bfloat16"] + end["float16"]))
both = summary["tp4 bfloat16 fp32 at both"]
lesson.expect("float32 TP sums: tiny at step 0, yet at the end more than plain bfloat16 TP 4's drift")
lesson.check("bfloat16 TP 4 + float32 TP sums: step 0, end (plain bfloat16 TP 4 at the end)",
             f"{both['step0_grad_difference']:.1e}, {both['vs_serial_same_dtype']:.1e} "
             f"({summary['tp4 bfloat16']['vs_serial_same_dtype']:.1e})",
             both["step0_grad_difference"] < 1e-4 and both["vs_serial_same_dtype"] > summary["tp4 bfloat16"]
             ["vs_serial_same_dtype"])
lesson.expect("every run still learns: its final loss is under 1 % of the first step's")
lesson.check("final loss / first loss, worst run", f"{max(c[-1] / c[0] for c in curves.values()):.4f}",
             all(c[-1] < 0.01 * c[0] for c in curves.values()))

# %% [markdown]
# ## What to take away
#
# * bfloat16 keeps float32's range with 8 significand bits: each rounding is off by at most u = 2^-8.
# * TP's activations cross the wire in 2 bytes; the sums accumulate in float32 and round at every step.
# * TP in 16 bits differs from serial in 16 bits by a few u, only because it adds rounded partials in another
#   order; float32 TP sums remove it at step 0 (not over training: it grows back), and float64 shows none.
# * float16 needs dynamic loss scaling (skip and halve on overflow, double after clean steps), agreed by every
#   rank; bfloat16 does not. tpsim starts at 2^16 (PyTorch's GradScaler), Megatron at 2^32.
# * Over 200 steps the loss of TP and serial drifts apart (peak ~5e-2 in 16 bits, ~1e-4 in float32) and settles
#   at ~1e-4 (16 bits), ~2e-7 (float32): every run still learns.
#
# Exercise: `ex15_mixed_precision.py`: `tpsim lesson start 15` copies it into your work folder (`tpsim-work/`), then
# `tpsim check 15`.

# %%
lesson.takeaways()
lesson.finish()
