"""A non-finite step is skipped on every rank together, at every dp × tp layout (the ``grid`` fixture).

Story: train the tiny GPT with a ``StepGuard``; at step 1 the last TP rank of every DP replica finds a NaN in
its shard of one gradient (after the DP sync, which spreads a diverged layer's NaN to every replica). Every rank must see a NaN norm,
skip the update (parameters and AdamW moments unchanged, bit for bit), name the same parameter, and take the
next step normally. The guarded step without a fault equals the plain clipped step exactly.
"""

from __future__ import annotations

import numpy as np

from tpsim.comm.agree import Agreement
from tpsim.models.build import build_gpt
from tpsim.arch.gpt2 import GPTConfig
from tpsim.train import AdamW, GradSync, StepGuard, apply_update, compute_grads, dp_slice, train_step
from tpsim.train.nonfinite import first_nonfinite

BATCH, SEQ = 8, 5
POISONED = "transformer.h.0.mlp.c_fc.weight"  # column-parallel: every TP rank holds a different shard


def setup(grid):
    cfg = GPTConfig(vocab_size=16 * grid.tp + 3, n_positions=SEQ, n_embd=16, n_layer=2, n_head=8)
    rng = np.random.default_rng(1)
    ids, labels = rng.integers(0, cfg.vocab_size, (2, BATCH, SEQ))
    rows = dp_slice(BATCH, grid.dp, grid.dp_rank)
    model = build_gpt(cfg, grid.tp_group, seed=3)
    return model, AdamW(model, lr=1e-2), GradSync(model, grid.dp_group), ids[rows], labels[rows]


def test_guarded_step_equals_the_plain_clipped_step(grid):
    runs = []
    for guarded in (False, True):
        model, opt, sync, ids, labels = setup(grid)
        result = train_step(model, opt, grid, sync, ids, labels, clip=0.5,
                            guard=StepGuard() if guarded else None)
        assert not result.skipped and result.reason is None
        runs.append((result, [p.copy() for _, p in model.named_parameters()]))
    (plain, p_plain), (guarded, p_guarded) = runs
    assert guarded.grad_norm == plain.grad_norm and guarded.loss == plain.loss
    assert all(np.array_equal(a, b) for a, b in zip(p_plain, p_guarded))


def test_a_nan_in_one_shard_skips_the_step_on_every_rank(grid):
    model, opt, sync, ids, labels = setup(grid)
    guard = StepGuard(max_skipped=3)
    train_step(model, opt, grid, sync, ids, labels, guard=guard)
    before = [p.copy() for _, p in model.named_parameters()]
    state = opt.state_dict()
    loss, _ = compute_grads(model, grid, sync, ids, labels)
    if grid.tp_rank == grid.tp - 1:  # one shard of the TP group; the other TP ranks hold finite grads
        dict(model.named_grads())[POISONED].flat[0] = np.nan
    norm = apply_update(model, opt, grid, 1.0, guard=guard, loss=loss)
    verdict = guard.last
    agree = Agreement()
    assert agree.all_true(verdict.skipped and np.isnan(norm)), "every rank skips (the norm is reduced over TP)"
    assert all(np.array_equal(a, b) for a, b in zip(before, (p for _, p in model.named_parameters())))
    after = opt.state_dict()
    assert after["step"] == state["step"], "a skipped step does not count in AdamW's bias correction"
    assert all(np.array_equal(after["state"][n][k], v) for n, slots in state["state"].items()
               for k, v in slots.items()), "AdamW's moments are untouched"
    named = [(e.name, e.grad) for e in model.named_entries()]
    assert first_nonfinite(named, agree) == POISONED
    guard.record(verdict, step=1)
    assert guard.consecutive == 1
    result = train_step(model, opt, grid, sync, ids, labels, guard=guard)  # the next step runs normally
    assert not result.skipped and np.isfinite(result.grad_norm) and guard.consecutive == 0
