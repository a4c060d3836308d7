"""Partial FC (InsightFace): a data-parallel backbone and a model-parallel classifier over millions of classes.

In face recognition the backbone is small next to the classifier W: [emb_dim, classes], which for millions
of identities dwarfs it. InsightFace splits only the classifier; the Megatron way splits everything over the
same ranks. Both give the serial model's loss and gradients; they differ in what moves and what is recomputed.

    InsightFace way (PartialFCModel), rank r of p, n = N / p samples each:
      x_r [n, F] --backbone (replicated, data-parallel)--> e_r [n, E]
      all_gather(e_r)                    -> e [N, E]       every rank scores every sample ...
      e · W_r                            -> z_r [N, C_r]   ... against its own classes [start_r, end_r)
      vocab-parallel CE on z_r           three all-reduces of [N] (max, Σexp, target logit)
      backward: de = dz_r · W_rᵀ [N, E] is a partial sum (only this slice's classes); reduce_scatter
                (all_gather's conjugate) adds them and hands rank r its own rows de_r [n, E];
                backbone backward on n samples; DP all-reduce of the backbone's gradients (sync_grads)
    Megatron way (MegatronFaceModel):
      broadcast the global batch x [N, F] from rank 0; every rank runs the whole backbone on all N samples
      (p copies of the same work); classifier = ColumnParallelLinear (f in front: backward all-reduce of
      de [N, E]); the same CE. The backbone's gradients come out identical everywhere: no DP sync.

Class slices may be uneven (``uneven_ranges``: classes % p ≠ 0); the vocab-parallel CE needs only each rank's
start and width. The loss is a plain softmax CE (no ArcFace margin, no normalisation): the parallel structure
is the point. Scaling: the CE is a mean over the GLOBAL batch, so each rank's backbone gradient is already its
share of the global gradient and ``sync_grads`` *sums* (DDP averages instead; InsightFace multiplies the
gathered gradient by p to cancel that 1/p — the same thing).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from tpsim.comm import Group
from tpsim.errors import ConfigError
from tpsim.nn.cross_entropy import CrossEntropyLoss
from tpsim.nn.linear import Linear
from tpsim.nn.mlp import GeluMLP
from tpsim.nn.module import Module, Partition
from tpsim.tp.column_parallel import ColumnParallelLinear
from tpsim.tp.cross_entropy import VocabParallelCrossEntropy
from tpsim.partition import uneven_ranges
from tpsim.phases import BACKWARD, DATA, DP_SYNC, FORWARD

WAYS = ("megatron", "partial_fc")


@dataclass(frozen=True)
class FaceConfig:
    """Sizes: features F (the synthetic "image"), hidden H, embedding E, classes C (identities)."""

    features: int = 32
    hidden: int = 64
    emb_dim: int = 16
    classes: int = 31


class Backbone(GeluMLP):
    """``x [n, F] -> embeddings [n, E]``: Linear(F, H) → GeLU → Linear(H, E), the MLP's forward and backward."""

    def __init__(self, features: int, hidden: int, emb_dim: int, *, rng: np.random.Generator,
                 dtype=np.float64) -> None:
        # std 1/sqrt(fan_in) keeps activations O(1), so the check compares numbers that matter
        c_fc = Linear(features, hidden, rng=rng, dtype=dtype, std=features ** -0.5)
        c_proj = Linear(hidden, emb_dim, rng=rng, dtype=dtype, std=hidden ** -0.5)
        super().__init__(c_fc, c_proj, "tanh")


def synthetic_batch(seed: int, batch_size: int, cfg: FaceConfig, dtype=np.float64) -> tuple[np.ndarray, np.ndarray]:
    """The global batch, the same on every rank for a seed: ``x [N, F]``, ``labels [N]`` int64 in [0, C)."""
    rng = np.random.default_rng([seed, 7])
    x = rng.standard_normal((batch_size, cfg.features)).astype(dtype)
    return x, rng.integers(0, cfg.classes, size=batch_size, dtype=np.int64)


def local_rows(batch_size: int, group: Group) -> slice:
    """The rows of the global batch that ``group.rank`` owns in the data-parallel backbone (rank order)."""
    n = batch_size // group.size
    return slice(group.rank * n, (group.rank + 1) * n)


class FaceCache(NamedTuple):
    """The cache of every face model: its three stages' caches."""

    backbone: tuple  # MLPCache
    classifier: tuple  # LinearCache
    loss: tuple  # (vocab-parallel) CrossEntropyCache


class _FaceModel(Module):
    """What the three models share: a backbone, the config, and a per-step gradient sync (none by default)."""

    def __init__(self, cfg: FaceConfig, backbone: Backbone) -> None:
        super().__init__()
        self.cfg = cfg
        self.backbone = backbone

    def sync_grads(self) -> None:
        """Make the gradients those of the global batch on every rank; nothing to do unless data-parallel."""


class SerialFaceModel(_FaceModel):
    """The reference: backbone + full classifier W [E, C] (no bias) + softmax CE, on the whole batch."""

    def __init__(self, cfg: FaceConfig, *, rng: np.random.Generator | None = None, dtype=np.float64) -> None:
        rng = np.random.default_rng(0) if rng is None else rng
        super().__init__(cfg, Backbone(cfg.features, cfg.hidden, cfg.emb_dim, rng=rng, dtype=dtype))
        self.classifier = Linear(cfg.emb_dim, cfg.classes, bias=False, rng=rng, dtype=dtype, std=cfg.emb_dim ** -0.5)
        self.loss = CrossEntropyLoss()
        self.set_path("")

    def forward(self, x: np.ndarray, labels: np.ndarray):
        """``x [N, F]``, ``labels [N]`` -> ``(mean loss, cache)``."""
        emb, c_bb = self.backbone.forward(x)  # [N, E]
        logits, c_cls = self.classifier.forward(emb)  # [N, C]
        loss, c_ce = self.loss.forward(logits, labels)
        return loss, FaceCache(c_bb, c_cls, c_ce)

    def backward(self, dloss, cache) -> np.ndarray:
        """Adds every gradient; returns d(embeddings) [N, E] — where the two parallel ways differ."""
        d_emb = self.classifier.backward(self.loss.backward(dloss, cache.loss), cache.classifier)
        self.backbone.backward(d_emb, cache.backbone)
        return d_emb


def class_range(classes: int, group: Group) -> range:
    """This rank's classes [start, end): contiguous, sizes differing by at most one, never empty.

    Raises ``ConfigError`` (on every rank alike) when classes < group size: the vocab-parallel CE cannot
    take a zero-width logits shard (its ``reshape(-1, 0)`` is ambiguous).
    """
    if classes < group.size:
        raise ConfigError(f"classes = {classes} is smaller than the {group.size} ranks of the {group.name} group: "
                          f"every rank needs at least one class")
    return uneven_ranges(classes, group.size)[group.rank]


class PartialFCModel(_FaceModel):
    """The InsightFace way over ``group``: replicated data-parallel backbone, class-sliced classifier."""

    def __init__(self, serial: SerialFaceModel, group: Group) -> None:
        cfg = serial.cfg
        super().__init__(cfg, copy.deepcopy(serial.backbone))  # replicated: every rank a copy of the master
        self.backbone.zero_grad()
        self.group = group
        cols = class_range(cfg.classes, group)
        w = serial.classifier.params["weight"]
        self.classifier = Linear(cfg.emb_dim, len(cols), bias=False, weight=w[:, cols.start:cols.stop], dtype=w.dtype)
        self.classifier.partition["weight"] = Partition(1, np.arange(cols.start, cols.stop), cfg.classes)
        self.loss = VocabParallelCrossEntropy(group, vocab_size=cfg.classes, vocab_start=cols.start)
        self.set_path("")

    def forward(self, x_local: np.ndarray, labels_local: np.ndarray):
        """``x_local [n, F]``, ``labels_local [n]`` (this rank's samples) -> ``(global mean loss, cache)``."""
        g, tr = self.group, self.group.tracer
        with tr.region(scope="loss", phase=DATA):  # every rank scores every sample, so needs every label
            labels = g.all_gather(np.ascontiguousarray(labels_local), axis=0)  # [N]
        with tr.region(scope="backbone", phase=FORWARD):
            emb, c_bb = self.backbone.forward(x_local)  # [n, E]: own samples only, no collective
        with tr.region(scope="embeddings", phase=FORWARD):
            emb_all = g.all_gather(emb, axis=0)  # [N, E] in rank order = global sample order
        with tr.region(scope="classifier", phase=FORWARD):
            logits, c_cls = self.classifier.forward(emb_all)  # [N, C_r]: no collective
        loss, c_ce = self.loss.forward(logits, labels)  # scope "loss": the three [N] all-reduces
        return loss, FaceCache(c_bb, c_cls, c_ce)

    def backward(self, dloss, cache) -> np.ndarray:
        """Adds every gradient; returns this rank's d(embeddings) [n, E]. Call ``sync_grads`` afterwards."""
        dlogits = self.loss.backward(dloss, cache.loss)  # [N, C_r], no collective
        d_emb_partial = self.classifier.backward(dlogits, cache.classifier)  # [N, E]: only this slice's classes' share
        with self.group.tracer.region(scope="embeddings", phase=BACKWARD):
            d_emb = self.group.reduce_scatter(d_emb_partial, axis=0)  # [n, E]: summed over slices, own rows
        self.backbone.backward(d_emb, cache.backbone)
        return d_emb

    def sync_grads(self) -> None:
        """DP all-reduce (SUM, see the module docstring) of the backbone's gradients as one flat bucket.

        Once per step after the last backward, like DDP: with micro-batches the local gradients accumulate
        and one all-reduce adds them all; it must not run twice over the same gradients.
        """
        grads = [gr for _, gr in self.backbone.named_grads()]
        flat = np.concatenate([gr.ravel() for gr in grads])  # one call, not one per tensor (DDP's bucket)
        with self.group.tracer.region(scope="backbone", phase=DP_SYNC):
            self.group.all_reduce(flat, inplace=True)
        offset = 0
        for gr in grads:
            gr[...] = flat[offset:offset + gr.size].reshape(gr.shape)
            offset += gr.size


class MegatronFaceModel(_FaceModel):
    """The Megatron way over ``group``: batch broadcast, redundant backbone, column-parallel classifier."""

    def __init__(self, serial: SerialFaceModel, group: Group) -> None:
        cfg = serial.cfg
        super().__init__(cfg, copy.deepcopy(serial.backbone))
        self.backbone.zero_grad()
        self.group = group
        cols = class_range(cfg.classes, group)
        self.classifier = ColumnParallelLinear.from_serial(serial.classifier, group, gather_output=False,
                                                           columns=np.arange(cols.start, cols.stop))
        self.loss = VocabParallelCrossEntropy(group, vocab_size=cfg.classes, vocab_start=cols.start)
        self.set_path("")

    def forward(self, x: np.ndarray, labels: np.ndarray):
        """``x [N, F]``, ``labels [N]``: the global batch, read on group rank 0 only (other ranks: any values)."""
        g, tr = self.group, self.group.tracer
        x, labels = np.array(x, order="C"), np.array(labels, order="C")  # own copies: broadcast writes in place
        with tr.region(phase=DATA):
            with tr.region(scope="backbone"):
                g.broadcast(x, root=0)
            with tr.region(scope="loss"):
                g.broadcast(labels, root=0)
        with tr.region(scope="backbone", phase=FORWARD):
            emb, c_bb = self.backbone.forward(x)  # [N, E] on EVERY rank: the same work p times
        logits, c_cls = self.classifier.forward(emb)  # scope "classifier": f is the identity forward
        loss, c_ce = self.loss.forward(logits, labels)
        return loss, FaceCache(c_bb, c_cls, c_ce)

    def backward(self, dloss, cache) -> np.ndarray:
        """Adds every gradient; returns d(embeddings) [N, E], replicated (f's all-reduce in the classifier)."""
        d_emb = self.classifier.backward(self.loss.backward(dloss, cache.loss), cache.classifier)
        self.backbone.backward(d_emb, cache.backbone)  # whole batch, whole gradient: identical on every rank
        return d_emb


def loss_and_grads(model: _FaceModel, x: np.ndarray, labels: np.ndarray) -> tuple[float, np.ndarray]:
    """One step's gradients from zero: forward, backward (dloss = 1), sync. Returns ``(loss, d_embeddings)``."""
    model.zero_grad()
    loss, cache = model.forward(x, labels)
    d_emb = model.backward(1.0, cache)
    model.sync_grads()
    return loss, d_emb


# --- FLOPs: what each rank computes per step ------------------------------------------------------------------
def matmul_flops(m: int, k: int, n: int) -> int:
    """[m, k] · [k, n]: m·n dot products of length k, a multiply and an add each."""
    return 2 * m * k * n


def backbone_flops(n_samples: int, cfg: FaceConfig) -> int:
    """Forward + backward (≈ 3 × forward: dx and dW each cost one forward) of the backbone on n samples.

    Matmuls only: GeLU and the bias adds are O(n·H), negligible next to O(n·F·H).
    """
    return 3 * (matmul_flops(n_samples, cfg.features, cfg.hidden) + matmul_flops(n_samples, cfg.hidden, cfg.emb_dim))


def classifier_flops(n_samples: int, cfg: FaceConfig, width: int) -> int:
    """Forward + backward (≈ 3 × forward) of ``e [n, E] · W_r [E, width]``."""
    return 3 * matmul_flops(n_samples, cfg.emb_dim, width)


@dataclass(frozen=True)
class StepFlops:
    """One rank's FLOPs in one step; ``backbone_redundant`` is work another rank also does."""

    backbone_useful: int
    backbone_redundant: int
    classifier: int

    @property
    def total(self) -> int:
        return self.backbone_useful + self.backbone_redundant + self.classifier


def step_flops(cfg: FaceConfig, batch_size: int, world: int, rank: int, way: str) -> StepFlops:
    """FLOPs of ``rank`` per step for ``way`` in ``WAYS``, with a global batch of ``batch_size`` samples.

    Both ways score all N samples against the rank's class slice. The InsightFace backbone runs on N / p
    samples; the Megatron backbone runs on all N, of which only a 1/p share counts as useful.
    """
    if way not in WAYS:
        raise ValueError(f"way must be one of {WAYS}, got {way!r}")
    width = len(uneven_ranges(cfg.classes, world)[rank])
    share = backbone_flops(batch_size // world, cfg)
    done = share if way == "partial_fc" else backbone_flops(batch_size, cfg)
    return StepFlops(share, done - share, classifier_flops(batch_size, cfg, width))


def redundant_flops(cfg: FaceConfig, batch_size: int, world: int, way: str) -> int:
    """Backbone FLOPs per step beyond one backbone pass over the batch, summed over all ranks.

    Megatron way: (p − 1) × ``backbone_flops(N)``; InsightFace way: 0.
    """
    return sum(step_flops(cfg, batch_size, world, r, way).backbone_redundant for r in range(world))
