"""Partial FC (InsightFace) and its Megatron twin vs the serial face model: loss, grads, traffic, FLOPs.

Classes = 7·p + 3 so the class slices are uneven whenever p does not divide 3; the world group is the
model-parallel group here (grid with tp = 1, group "world").
"""

from __future__ import annotations

import numpy as np
import pytest

from tpsim.errors import ConfigError
from tpsim.models.partial_fc import (FaceConfig, MegatronFaceModel, PartialFCModel, SerialFaceModel,
                                     backbone_flops, class_range, classifier_flops, local_rows, loss_and_grads,
                                     redundant_flops, step_flops, synthetic_batch)
from tpsim.partition import take_shard
from _util import assert_close
from conftest import get_grid

PER_RANK = 3  # samples per rank: the global batch is 3·p


def setup(seed: int = 5):
    grid = get_grid(1)
    world = grid.world
    cfg = FaceConfig(features=13, hidden=17, emb_dim=11, classes=7 * world.size + 3)
    n = PER_RANK * world.size
    serial = SerialFaceModel(cfg, rng=np.random.default_rng(seed))
    x, labels = synthetic_batch(seed, n, cfg)
    x *= 3.0  # larger activations, so the check is not on numbers near zero
    with grid.tracer.paused():
        loss_ref, d_emb_ref = loss_and_grads(serial, x, labels)
    return grid, world, cfg, serial, x, labels, loss_ref, d_emb_ref


def check_grads(model, serial, what: str) -> None:
    ref = dict(serial.named_grads())
    names = [name for name, _ in model.named_grads()]
    assert names == list(ref), f"{what}: parameter names {names} != {list(ref)}"
    for name, _, g, part in model.named_entries():
        assert_close(g, take_shard(ref[name], part), 1e-12, f"{what} {name} grad")


def test_partial_fc_equals_serial_with_uneven_class_slices():
    grid, world, cfg, serial, x, labels, loss_ref, d_emb_ref = setup()
    model = PartialFCModel(serial, world)
    mine = local_rows(len(x), world)
    loss, d_emb = loss_and_grads(model, x[mine], labels[mine])
    cols = class_range(cfg.classes, world)
    assert model.classifier.params["weight"].shape == (cfg.emb_dim, len(cols))
    assert_close(np.float64(loss), np.float64(loss_ref), 1e-12, "loss")
    # the reduce_scatter hands each rank exactly its own samples' embedding gradients
    assert_close(d_emb, d_emb_ref[mine], 1e-12, "d(embeddings) of this rank's samples")
    check_grads(model, serial, "partial FC")
    assert_close(model.classifier.grads["weight"], serial.classifier.grads["weight"][:, cols.start:cols.stop],
                 1e-12, "classifier shard = the matching columns")


def test_megatron_face_equals_serial():
    grid, world, cfg, serial, x, labels, loss_ref, d_emb_ref = setup(seed=8)
    model = MegatronFaceModel(serial, world)
    # only rank 0 holds the batch: the broadcast must deliver it
    x_in, labels_in = (x, labels) if world.rank == 0 else (np.zeros_like(x), np.zeros_like(labels))
    loss, d_emb = loss_and_grads(model, x_in, labels_in)
    assert_close(np.float64(loss), np.float64(loss_ref), 1e-12, "loss")
    assert_close(d_emb, d_emb_ref, 1e-12, "d(embeddings)")
    check_grads(model, serial, "Megatron")


def test_large_logits_are_stable():
    """Classifier weights ×1000: the CE's max-trick must keep both ways finite and equal to serial."""
    grid, world, cfg, serial, x, labels, _, _ = setup(seed=3)
    serial.classifier.params["weight"] *= 1000.0
    with grid.tracer.paused():
        loss_ref, _ = loss_and_grads(serial, x, labels)
    mine = local_rows(len(x), world)
    for model, args in ((PartialFCModel(serial, world), (x[mine], labels[mine])),
                        (MegatronFaceModel(serial, world), (x, labels))):
        loss, _ = loss_and_grads(model, *args)
        assert np.isfinite(loss) and loss > 1.0
        assert_close(np.float64(loss), np.float64(loss_ref), 1e-12, f"{type(model).__name__} loss")
        check_grads(model, serial, type(model).__name__)


def test_fewer_classes_than_ranks_is_a_config_error():
    grid, world, cfg, serial, *_ = setup()
    serial.cfg = FaceConfig(classes=world.size - 1)  # only the count matters: it is checked first
    for cls in (PartialFCModel, MegatronFaceModel):
        with pytest.raises(ConfigError, match="every rank needs at least one class"):
            cls(serial, world)


def events(grid, phase):
    return [(e.op, e.scope, e.shape) for e in grid.tracer.events if e.phase == phase]


def test_partial_fc_communication():
    """Forward: one all_gather [N, E] + the CE's three [N] all-reduces; backward: one reduce_scatter; DP sync."""
    grid, world, cfg, serial, x, labels, _, _ = setup()
    n = len(x)
    mine = local_rows(n, world)
    model = PartialFCModel(serial, world)
    grid.tracer.reset()
    loss_and_grads(model, x[mine], labels[mine])
    assert events(grid, "data") == [("all_gather", "loss", (n,))]
    assert events(grid, "forward") == [("all_gather", "embeddings", (n, cfg.emb_dim))] + \
        [("all_reduce", "loss", (n,))] * 3
    assert events(grid, "backward") == [("reduce_scatter", "embeddings", (n, cfg.emb_dim))]
    n_backbone = sum(p.size for _, p in model.backbone.named_parameters())
    assert events(grid, "dp_sync") == [("all_reduce", "backbone", (n_backbone,))]
    assert all(e.group == "world" for e in grid.tracer.events)
    assert {e.phase for e in grid.tracer.events} == {"data", "forward", "backward", "dp_sync"}


def test_megatron_face_communication():
    """Broadcast of the batch, the CE's three all-reduces, f's backward all-reduce of d(emb); no all_gather."""
    grid, world, cfg, serial, x, labels, _, _ = setup()
    n = len(x)
    model = MegatronFaceModel(serial, world)
    grid.tracer.reset()
    loss_and_grads(model, x, labels)
    assert events(grid, "data") == [("broadcast", "backbone", (n, cfg.features)), ("broadcast", "loss", (n,))]
    assert events(grid, "forward") == [("all_reduce", "loss", (n,))] * 3
    assert events(grid, "backward") == [("all_reduce", "classifier", (n, cfg.emb_dim))]
    assert not [e for e in grid.tracer.events if e.op == "all_gather"]
    assert not events(grid, "dp_sync")


def test_flop_counter_redundant_work():
    world = get_grid(1).world.size
    cfg = FaceConfig(features=13, hidden=17, emb_dim=11, classes=7 * world + 3)
    n = PER_RANK * world
    full = backbone_flops(n, cfg)
    assert full == 3 * 2 * n * (13 * 17 + 17 * 11)
    assert redundant_flops(cfg, n, world, "megatron") == (world - 1) * full
    assert redundant_flops(cfg, n, world, "partial_fc") == 0
    per_rank = {way: [step_flops(cfg, n, world, r, way) for r in range(world)] for way in ("megatron", "partial_fc")}
    # useful backbone work sums to one backbone pass either way; every rank does a whole pass the Megatron way
    for way, flops in per_rank.items():
        assert sum(f.backbone_useful for f in flops) == full, way
        assert sum(f.classifier for f in flops) == classifier_flops(n, cfg, cfg.classes), way
    assert all(f.backbone_useful + f.backbone_redundant == full for f in per_rank["megatron"])
    with pytest.raises(ValueError, match="way must be one of"):
        step_flops(cfg, n, world, 0, "zero")
