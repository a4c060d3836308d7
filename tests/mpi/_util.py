"""Comparison helpers shared by the multi-rank tests (the difference itself is ``tpsim.compare``'s)."""

from __future__ import annotations

import numpy as np

from tpsim.compare import relative_difference


def assert_close(actual, expected, tol: float = 1e-12, what: str = "") -> None:
    """max |actual − expected| ≤ tol · max(1, max |expected|), i.e. ``relative_difference`` ≤ tol; names the tensor."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    d = relative_difference(actual, expected, floor=1.0)
    assert d <= tol, f"{what}: max |diff| / max(1, max |expected|) = {d:.3e} > {tol:.0e}"


def randn(seed: int, *shape, dtype=np.float64) -> np.ndarray:
    """The same random array on every rank for the same seed."""
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def assert_shards_match_serial(par, serial, grads: bool = True, tol: float = 1e-10) -> None:
    """Every parameter (or gradient) of the TP model ``par`` equals its slice of the serial twin's, relative
    ``tol``; the names and their order are the serial model's."""
    from tpsim.compare import shard_differences

    ref = dict(serial.named_grads() if grads else serial.named_parameters())
    assert [n for n, _ in par.named_parameters()] == list(ref), "parameter names differ from the serial model's"
    worst = shard_differences(par, ref, grads=grads, floor=1e-300)
    bad = {k: f"{v:.1e}" for k, v in worst.items() if v > tol}
    assert not bad, f"{'gradients' if grads else 'parameters'} differ from serial (relative): {bad}"


def assert_training_with_clipping_matches_serial(grid, serial, par, ids, labels, steps: int = 2,
                                                 tol: float = 1e-10) -> None:
    """``steps`` of DP × TP training of ``par`` (AdamW, lr 1e-2, DDP, clipping at half the serial norm so it
    really scales) against the serial twin on the whole batch: loss, grad norm and every parameter after."""
    from tpsim.train import AdamW, GradSync, check_replicas, dp_slice, train_step

    opt_s = AdamW(serial, lr=1e-2)
    sync, opt_p = GradSync(par, grid.dp_group), AdamW(par, lr=1e-2)
    rows = dp_slice(ids.shape[0], grid.dp, grid.dp_rank)
    for step in range(steps):
        loss_s = serial.loss_and_grads(ids, labels)
        norm_s = float(np.sqrt(sum(np.vdot(g, g) for _, g in serial.named_grads())))
        max_norm = norm_s / 2
        for _, g in serial.named_grads():
            g *= max_norm / (norm_s + 1e-6)
        opt_s.step()
        result = train_step(par, opt_p, grid, sync, ids[rows], labels[rows], clip=max_norm)
        assert abs(result.loss - loss_s) <= tol * loss_s, f"step {step}: loss {result.loss} vs {loss_s}"
        assert abs(result.grad_norm - norm_s) <= tol * norm_s, f"step {step}: norm {result.grad_norm} vs {norm_s}"
    assert_shards_match_serial(par, serial, grads=False, tol=tol)
    report = check_replicas(par, grid)
    assert report.ok, report.summary()


def assert_step_matches_formulas(grid, model, cfg, sp: bool, seq: int, title: str) -> None:
    """One traced training step of ``model`` (2 rows a DP rank, DDP in 8 KiB buckets, clipping, AdamW) against
    ``predict_step`` row by row, calls, bytes and wire bytes exactly; the ``kv`` group present iff tp > kv heads;
    the DDP bytes = the formula's parameters."""
    from tpsim.config import RunConfig
    from tpsim.predict.formulas import predict_step
    from tpsim.predict.memory import param_elements
    from tpsim.trace.formula_check import compare, format_comparison
    from tpsim.train import AdamW, GradSync, apply_update, broadcast_batch, compute_grads, dp_slice

    sync = GradSync(model, grid.dp_group, bucket_cap_bytes=8192)
    opt = AdamW(model, lr=1e-3)
    batch = 2 * grid.dp
    rows = dp_slice(batch, grid.dp, grid.dp_rank)
    ids, labels = np.random.default_rng(7).integers(0, cfg.vocab_size, (2, batch, seq))
    grid.tracer.reset()
    grid.tracer.step = 0
    ids, labels = broadcast_batch(grid, ids[rows], labels[rows])
    compute_grads(model, grid, sync, ids, labels)
    apply_update(model, opt, grid, 1.0)
    run = RunConfig.of(cfg, tp=grid.tp, dp=grid.dp, sp=sp, batch_size=batch, seq_len=seq)
    predicted = predict_step(run, clip=True, ddp_buckets=len(sync.buckets))
    compared = compare([e.as_dict() for e in grid.tracer.events], predicted)
    table = format_comparison(compared, title=f"{title}, TP({grid.tp}) x DP({grid.dp}) rank {grid.rank}:")
    assert all(r.match and r.measured_wire == r.predicted_wire for r in compared), table
    assert any(r.group == "kv" for r in compared) == (grid.tp > cfg.kv_heads), table
    assert sync.total_bytes == param_elements(cfg, grid.tp) * 8


def assert_memory_matches_formulas(grid, model, cfg, sp: bool, seq: int, block: int, title: str) -> None:
    """A forward of 3 rows: the parameter, gradient, optimizer and activation bytes this rank holds equal
    ``predict_memory`` exactly, and the first layer's cache holds ``block`` float64 elements, no masks."""
    from tpsim.predict.memory import predict_memory
    from tpsim.trace.measure import format_memory, measure_activations, measure_memory
    from tpsim.train import AdamW, GradSync

    GradSync(model, grid.dp_group)
    ids, labels = np.random.default_rng(3).integers(0, cfg.vocab_size, (2, 3, seq))
    with grid.tracer.paused():
        _, cache = model.forward(ids, labels)
    measured = measure_memory(model, AdamW(model), cache, exclude=(ids, labels))
    predicted = predict_memory(cfg, grid.tp, 3, seq, np.float64, tp_rank=grid.tp_rank, sequence_parallel=sp)
    table = format_memory(measured, predicted, title=f"{title} TP({grid.tp}) rank {grid.tp_rank}:")
    for key, value in predicted.items():
        assert getattr(measured, key) == value, f"{key}\n{table}"
    assert measure_activations(cache.transformer.h[0]) == {"activations": 8 * block, "masks": 0, "indices": 0}
