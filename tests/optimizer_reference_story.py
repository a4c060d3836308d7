"""The optimizer protocol against its independent reference (``tpsim.train.reference``), in float16 with a loss
scale — shared by tests/test_optimizer_protocol.py (one process) and tests/mpi/test_optimizer_reference.py
(every rank, DP = the world, so ZeRO-1 slices over 1, 2, 4 and 8 ranks).

Story: a float16 GPT (odd sizes, so ZeRO-1 pads its buckets and parameters straddle two owners) trains STEPS
clipped AdamW steps with the plain mixed-precision optimizer or with ZeRO-1, loss scale 2^10 growing every
second clean step, and an inf planted in one gradient at INF_STEP. Teacher-forced: each step, the loss-scaled
float32 main gradients the optimizer is about to read (DP-synced; ZeRO-1's owned slices gathered back into whole
gradients) are handed to the reference too, which unscales, agrees on found-inf, clips and steps them its own
way. So both step from the same numbers and may differ only by float32 roundings taken in another order:

    the norm                relative 1e-6 (both sum squares in float64; the two orders differ by ~1e-16)
    the loss scale, t       exactly
    AdamW's m and v         TOL_STATE of each tensor's largest value (AdamW's arithmetic, element by element)
    the float16 parameters  one float16 rounding (2^-10) of each tensor's largest value

A step in the wrong order — clipping before unscaling measures S·‖g‖ (here 1024×) — fails the norm at once,
and m and v by the same factor; an overflow agreed on one rank only hangs or mis-skips.
"""

from __future__ import annotations

import numpy as np

from tpsim.arch.gpt2 import GPTConfig
from tpsim.models.build import build_gpt
from tpsim.train import AdamW, DynamicLossScaler, GradSync, apply_update, compute_grads, dp_slice, mixed_precision
from tpsim.train.reference import ReferenceMixedPrecision
from tpsim.train.zero import DistributedOptimizer

BATCH, SEQ, STEPS, CAP, CLIP = 8, 5, 5, 1000, 0.05
SCALE, GROWTH, INF_STEP = 2.0 ** 10, 2, 3
TOL_NORM, TOL_STATE, ULP16 = 1e-6, 1e-5, 2.0 ** -10
CFG = GPTConfig(vocab_size=19, n_positions=SEQ, n_embd=9, n_layer=1, n_head=3)


def _adamw(model):
    return AdamW(model, lr=1e-2, weight_decay=0.1, no_decay=lambda n: n.endswith("bias"))


def _relative(got, want) -> float:
    return float(np.max(np.abs(got.astype(np.float64) - want), initial=0.0) / max(np.max(np.abs(want)), 1e-30))


def against_reference(grid, zero: bool) -> tuple[list[str], list[float | None]]:
    """``(failures, norms)``: what differed from the reference at which step (empty: nothing), and the norms."""
    model = build_gpt(CFG, grid.tp_group, seed=3, dtype=np.float16)
    scaler = DynamicLossScaler(scale=SCALE, growth_interval=GROWTH)
    if zero:
        opt = sync = DistributedOptimizer(_adamw(model), grid, bucket_cap_bytes=CAP, loss_scaler=scaler)
    else:
        sync = GradSync(model, grid.dp_group, bucket_cap_bytes=CAP)
        opt = mixed_precision(model, _adamw, grid.world, loss_scaler=scaler)
    names = [n for n, _ in model.named_parameters()]
    rule = opt.rule
    ref = ReferenceMixedPrecision([p.copy() for _, p in model.named_parameters()], scale=SCALE, lr=rule.lr,
                                  betas=rule.betas, eps=rule.eps, decays=[rule.decay_for(n) for n in names],
                                  growth_interval=GROWTH)
    rng, rows = np.random.default_rng(1), dp_slice(BATCH, grid.dp, grid.dp_rank)
    failures, norms = [], []
    for step in range(STEPS):
        ids, labels = rng.integers(0, CFG.vocab_size, (2, BATCH, SEQ))
        compute_grads(model, grid, sync, ids[rows], labels[rows], loss_scale=opt.loss_scale)
        sync.gather_grads()  # ZeRO-1: the whole reduced gradients, for the reference (a GradSync has them)
        grads = dict(model.named_grads())
        if step == INF_STEP:  # under ZeRO-1 only the element's owner reads it: found-inf must be agreed
            grads[names[-1]].reshape(-1)[0] = np.inf
        expected = ref.step(list(grads.values()), CLIP)
        norm = apply_update(model, opt, grid, CLIP)
        norms.append(norm)
        failures += _compare(step, opt, model, ref, names, norm, expected)
    return failures, norms


def _compare(step, opt, model, ref, names, norm, expected) -> list[str]:
    out = []
    if (norm is None) != (expected is None) or (norm is not None and abs(norm - expected) > TOL_NORM * expected):
        out.append(f"step {step}: norm {norm} vs the reference's {expected}")
    if (opt.loss_scale, opt.step_count) != (ref.scale, ref.t):
        out.append(f"step {step}: loss scale, steps {opt.loss_scale}, {opt.step_count} vs {ref.scale}, {ref.t}")
    index = {n: i for i, n in enumerate(names)}
    for part in opt.state_slices():
        i = index[part.name]
        for slot, full in (("exp_avg", ref.m[i]), ("exp_avg_sq", ref.v[i])):
            mine = part.slots[slot].reshape(-1)
            want = full.reshape(-1)[part.start:part.start + mine.size]
            worst = float(np.max(np.abs(mine - want), initial=0.0)) / max(float(np.max(np.abs(full))), 1e-30)
            if worst > TOL_STATE:
                out.append(f"step {step}: {slot} of {slice.name} differs by {worst:.2e}")
    for (name, p), want in zip(model.named_parameters(), ref.rounded()):
        if (worst := _relative(p, want.astype(np.float64))) > ULP16:
            out.append(f"step {step}: float16 {name} differs by {worst:.2e}")
    return out
