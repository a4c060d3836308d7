"""Data parallelism on top of tensor parallelism: every dp × tp layout of the world trains like one serial model.

Story: draw the serial GPT and train it with AdamW on the whole global batch; build the same GPT sharded over
the TP group, give each DP replica its block of rows, train it with ``train_step`` (DDP-style bucketed gradient
averaging, a global-token loss normaliser) and compare the loss at every step and every parameter shard at the
end. At world 8 the ``grid`` fixture runs the layouts 8×1, 4×2, 2×4, 1×8 (dp × tp); at world 4: 4×1, 2×2, 1×4.
Then: bucketed = unbucketed bit for bit, padding spread unevenly over the replicas, dropout, the broadcasts
that repair a perturbed replica, the consistency check, and the trace of one sync.
"""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

from tpsim.compare import shard_differences
from tpsim.errors import ConfigError
from tpsim.models.build import build_gpt, serial_gpt
from tpsim.arch.gpt2 import GPTConfig
from tpsim.nn.dropout import DropoutPlan
from tpsim.tp.random import ExactDropoutRNG
from tpsim.train import (AdamW, GradSync, broadcast_batch, broadcast_params, check_replicas, dp_slice,
                         train_step)

TOL = 1e-10
BATCH, SEQ = 8, 5  # global batch: divisible by every dp up to 8
SMALL_CAP = 4096  # bytes: several buckets even for the tiny model


def config(tp: int, dropout: float = 0.0) -> GPTConfig:
    return GPTConfig(vocab_size=16 * tp + 3, n_positions=SEQ, n_embd=16, n_layer=2, n_head=8, dropout=dropout)


def data(cfg: GPTConfig, seed: int = 1):
    rng = np.random.default_rng(seed)
    return rng.integers(0, cfg.vocab_size, (BATCH, SEQ)), rng.integers(0, cfg.vocab_size, (BATCH, SEQ))


def uneven_padding(labels: np.ndarray) -> np.ndarray:
    """Ignore a different number of tokens in different rows (row 1 entirely: a replica may get no tokens)."""
    labels = labels.copy()
    labels[0, :3] = labels[1, :] = labels[5, 1] = labels[6, :4] = -100
    return labels


def serial_training(cfg, ids, labels, steps, seed=3, plan=DropoutPlan()):
    """The reference: one model, the whole global batch, plain forward/backward/AdamW. Returns (model, losses)."""
    model = serial_gpt(cfg, seed)
    opt = AdamW(model, lr=1e-2)
    losses = []
    for step in range(steps):
        losses.append(model.loss_and_grads(ids, labels, DropoutPlan(plan.rng, step)))
        opt.step()
    return model, losses


def dp_training(grid, cfg, ids, labels, steps, cap=SMALL_CAP, seed=3, rng=None):
    """This rank's part of TP × DP training on its DP block of the global batch. Returns (model, results)."""
    model = build_gpt(cfg, grid.tp_group, seed)
    sync = GradSync(model, grid.dp_group, bucket_cap_bytes=cap)
    opt = AdamW(model, lr=1e-2)
    rows = dp_slice(BATCH, grid.dp, grid.dp_rank)
    results = []
    for step in range(steps):
        plan = DropoutPlan(rng, step, batch_index=np.arange(BATCH)[rows])
        results.append(train_step(model, opt, grid, sync, ids[rows], labels[rows], plan=plan))
    return model, results


def assert_matches_serial(par, serial, which="params"):
    """Every local tensor (shard or replica) equals the serial tensor's matching part, relative to its size."""
    ref = dict(serial.named_parameters() if which == "params" else serial.named_grads())
    worst = shard_differences(par, ref, grads=which != "params", floor=1e-300)  # relative to each tensor's scale
    bad = {k: f"{v:.1e}" for k, v in worst.items() if v > TOL}
    assert not bad, f"{which} differ from serial (relative): {bad}"


def assert_losses_match(results, losses):
    got = [r.loss for r in results]
    rel = [abs(a - b) / abs(b) for a, b in zip(got, losses)]
    assert max(rel) <= TOL, f"losses {got} vs serial {losses} (relative diff {max(rel):.1e})"


# --- DP × TP equals serial ------------------------------------------------------------------------------------
def test_dp_tp_training_equals_serial(grid):
    cfg = config(grid.tp)
    ids, labels = data(cfg)
    serial, losses = serial_training(cfg, ids, labels, steps=3)
    par, results = dp_training(grid, cfg, ids, labels, steps=3)
    assert_losses_match(results, losses)
    assert all(r.tokens == BATCH * SEQ and r.grad_norm is None for r in results)
    assert_matches_serial(par, serial)
    report = check_replicas(par, grid)  # and training kept the replicas bit-for-bit identical
    assert report.ok, report.summary()


def test_bucketed_and_unbucketed_sync_agree_bitwise(grid):
    cfg = config(grid.tp)
    ids, labels = data(cfg, seed=2)
    bucketed, _ = dp_training(grid, cfg, ids, labels, steps=3, cap=SMALL_CAP)
    unbucketed, _ = dp_training(grid, cfg, ids, labels, steps=3, cap=None)
    differ = [name for (name, a), (_, b) in zip(bucketed.named_parameters(), unbucketed.named_parameters())
              if not np.array_equal(a, b)]
    assert not differ, f"bucketed and unbucketed training differ in {differ}"


def test_uneven_padding_across_replicas_still_equals_serial(grid):
    """The loss is the mean over the *global* batch's valid tokens, not the mean of the replicas' means."""
    cfg = config(grid.tp)
    ids, labels = data(cfg, seed=4)
    labels = uneven_padding(labels)
    serial = serial_gpt(cfg, seed=3)
    loss_s = serial.loss_and_grads(ids, labels)
    par, results = dp_training(grid, cfg, ids, labels, steps=1)
    assert_losses_match(results, [loss_s])
    assert results[0].tokens == int(np.count_nonzero(labels != -100))
    assert_matches_serial(par, serial, which="grads")  # the optimizer reads the grads, never writes them


def test_dp_with_dropout_equals_serial_with_dropout(grid):
    """ExactDropoutRNG keyed by global rows: replica d draws the serial model's bits for its own rows."""
    cfg = config(grid.tp, dropout=0.2)
    ids, labels = data(cfg, seed=5)
    rng = ExactDropoutRNG(11)
    serial, losses = serial_training(cfg, ids, labels, steps=1, plan=DropoutPlan(rng))
    par, results = dp_training(grid, cfg, ids, labels, steps=1, rng=rng)
    assert_losses_match(results, losses)
    assert_matches_serial(par, serial, which="grads")
    assert_matches_serial(par, serial)
    assert losses[0] != serial_gpt(cfg, seed=3).forward(ids, labels)[0], "dropout did nothing"


def test_train_step_with_clipping_equals_serial_clipping(grid):
    cfg = config(grid.tp)
    ids, labels = data(cfg, seed=6)
    serial = serial_gpt(cfg, seed=3)
    serial.loss_and_grads(ids, labels)
    norm_s = float(np.sqrt(sum(np.vdot(g, g) for _, g in serial.named_grads())))
    max_norm = norm_s / 2  # so clipping really scales
    for _, g in serial.named_grads():
        g *= max_norm / (norm_s + 1e-6)
    par = build_gpt(cfg, grid.tp_group, seed=3)
    rows = dp_slice(BATCH, grid.dp, grid.dp_rank)
    result = train_step(par, AdamW(par, lr=1e-2), grid, GradSync(par, grid.dp_group), ids[rows], labels[rows],
                        clip=max_norm)
    assert abs(result.grad_norm - norm_s) <= TOL * norm_s, f"norm {result.grad_norm} vs serial {norm_s}"
    assert_matches_serial(par, serial, which="grads")


# --- broadcasts and the consistency check ---------------------------------------------------------------------
def test_broadcast_params_repairs_perturbed_replicas(grid):
    if grid.world_size == 1:
        pytest.skip("one rank has no replica to disagree with")
    cfg = config(grid.tp)
    model = build_gpt(cfg, grid.tp_group, seed=3)
    original = {name: p.copy() for name, p in model.named_parameters()}
    params = dict(model.named_parameters())
    assert check_replicas(model, grid).ok
    expected = set()
    if grid.tp > 1 and grid.tp_rank == 1:  # a replicated parameter drifts on one TP rank (of every replica)
        params["transformer.ln_f.weight"] += 1.0
    if grid.tp > 1:
        expected |= {("transformer.ln_f.weight", "tp", tuple(grid.layout[g])) for g in range(grid.dp)}
    if grid.dp > 1 and grid.dp_rank == 1:  # a (sharded, at tp > 1) parameter drifts in DP replica 1
        params["transformer.h.0.mlp.c_fc.weight"] -= 0.5
    if grid.dp > 1:
        expected |= {("transformer.h.0.mlp.c_fc.weight", "dp", tuple(grid.layout[:, t])) for t in range(grid.tp)}

    grid.tracer.reset()
    report = check_replicas(model, grid)
    assert {(m.name, m.group, m.ranks) for m in report.mismatches} == expected, report.summary()
    assert not report.ok and "INCONSISTENT" in report.summary()
    assert all(e.phase == "verify" for e in grid.tracer.events)
    summaries = MPI.COMM_WORLD.allgather(report.summary())
    assert len(set(summaries)) == 1, "the verdict must be the same on every rank"

    grid.tracer.reset()
    broadcast_params(model, grid)
    n_replicated = sum(part is None for _, part in model.named_partitions())
    n_expected = (n_replicated if grid.tp > 1 else 0) + (len(original) if grid.dp > 1 else 0)
    init = grid.tracer.select(phase="init", op="broadcast")
    assert len(init) == len(grid.tracer.events) == n_expected
    report = check_replicas(model, grid)
    assert report.ok, report.summary()
    assert report.summary() == (f"replicas consistent: {len(original)} params identical across DP ({grid.dp} "
                                f"{'replica' if grid.dp == 1 else 'replicas'}), {n_replicated} replicated params "
                                f"identical across TP ({grid.tp} {'rank' if grid.tp == 1 else 'ranks'})")
    changed = [n for n, p in model.named_parameters() if not np.array_equal(p, original[n])]
    assert not changed, f"the broadcast did not restore replica 0's values: {changed}"


def test_broadcast_batch_gives_the_tp_group_rank0s_rows(grid):
    ids, labels = data(config(grid.tp), seed=7)
    rows = dp_slice(BATCH, grid.dp, grid.dp_rank)
    if grid.tp_rank == 0:
        mine = ids[rows], labels[rows]
    else:  # only the shape is read here
        mine = np.zeros((BATCH // grid.dp, SEQ), np.int64), np.zeros((BATCH // grid.dp, SEQ), np.int64)
    got_ids, got_labels = broadcast_batch(grid, *mine)
    assert np.array_equal(got_ids, ids[rows]) and np.array_equal(got_labels, labels[rows])
    events = grid.tracer.select(phase="data")
    assert [(e.op, e.group, e.shape) for e in events] == ([("broadcast", "tp", (2, BATCH // grid.dp, SEQ))]
                                                          if grid.tp > 1 else [])


def test_dp_slice_blocks_and_errors():
    assert [dp_slice(12, 3, d) for d in range(3)] == [slice(0, 4), slice(4, 8), slice(8, 12)]
    with pytest.raises(ConfigError, match="--batch-size 6 is not divisible by dp 4"):
        dp_slice(6, 4, 0)
    with pytest.raises(ConfigError, match="dp rank 4 is outside a DP group of size 4"):
        dp_slice(8, 4, 4)


# --- the buckets and their trace ------------------------------------------------------------------------------
def test_gradients_are_views_into_buckets(grid):
    model = build_gpt(config(grid.tp), grid.tp_group, seed=3)
    sync = GradSync(model, grid.dp_group, bucket_cap_bytes=SMALL_CAP)
    grads = dict(model.named_grads())
    packed = [name for b in sync.buckets for name in b.names]
    assert packed == list(grads)[::-1], "parameters are packed in reverse registration order"
    assert len(sync.buckets) > 2
    assert all(b.nbytes <= SMALL_CAP or len(b.names) == 1 for b in sync.buckets)
    for name, g in grads.items():
        assert any(np.shares_memory(g, buf) for buf in sync.buffers), f"{name} is not a view into a bucket"
    assert model.lm_head.grads["weight"] is model.transformer.wte.grads["weight"], "tied gradient split"
    for buf in sync.buffers:
        buf[...] = 1.0
    model.zero_grad()  # fills in place: the buckets see it
    assert all(not buf.any() for buf in sync.buffers)
    unbucketed = GradSync(build_gpt(config(grid.tp), grid.tp_group, seed=3), grid.dp_group, bucket_cap_bytes=0)
    assert [len(b.names) for b in unbucketed.buckets] == [1] * len(grads)


@pytest.mark.parametrize("cap", [SMALL_CAP, None], ids=["bucketed", "unbucketed"])
def test_sync_trace_is_one_all_reduce_per_bucket(grid, cap):
    cfg = config(grid.tp)
    model = build_gpt(cfg, grid.tp_group, seed=3)
    sync = GradSync(model, grid.dp_group, bucket_cap_bytes=cap)
    ids, labels = data(cfg)
    rows = dp_slice(BATCH, grid.dp, grid.dp_rank)
    model.loss_and_grads(ids[rows], labels[rows])
    grid.tracer.reset()
    sync.sync()
    events = grid.tracer.events
    if grid.dp == 1:
        assert events == [], "dp == 1: nothing to average"
        return
    assert [(e.op, e.reduce_op, e.group, e.phase, e.scope) for e in events] == \
        [("all_reduce", "sum", "dp", "dp_sync", f"ddp.bucket{i}") for i in range(len(sync.buckets))]
    assert sum(e.bytes for e in events) == sum(g.nbytes for _, g in model.named_grads()) == sync.total_bytes

    # a whole train_step adds exactly one tiny all-reduce: the global token count and loss sum
    grid.tracer.reset()
    train_step(model, AdamW(model), grid, sync, ids[rows], labels[rows])
    extra = [e for e in grid.tracer.select(phase="dp_sync") if not e.scope.startswith("ddp.")]
    assert [(e.scope, e.group, e.shape) for e in extra] == [("loss_normalizer", "dp", (2,))]
