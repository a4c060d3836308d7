"""ZeRO-1 over the DP group, the way Megatron-LM's distributed optimizer does it, under tensor parallelism.

Plain DP (``GradSync``) all-reduces every gradient and every DP rank then runs the same optimizer step on the
same numbers: the optimizer state is replicated d times. ZeRO stage 1 (Rajbhandari et al. 2019,
arXiv:1910.02054) keeps the step's result and splits the work and the state:

    grads  ── reduce-scatter (dp_sync) ──▶  my 1/d slice, summed, ÷ d      (bucket by bucket, like GradSync)
    clip   ── one all-reduce over the world of my slice's Σg² (TP-replicated params counted on tp_rank 0 only)
    step   ── AdamW on my slice only: m and v exist for 1/d of the parameters
    params ── all-gather (optimizer) ──▶  every rank's updated slice back into the model's arrays

An all-reduce *is* a reduce-scatter followed by an all-gather (that is how the ring does it), so ZeRO-1 moves
exactly the bytes plain DP moves, 2(d−1)/d of the buffer per rank; it only moves the step into the middle
(in one dtype: under mixed precision, below, the all-gather carries 16-bit parameters, half the bytes).

Layout (``tpsim.predict.model_state``): the gradients become views into flat buckets (``GradSync`` with
``pad_to=dp``), each padded with zeros to a multiple of d; DP rank r owns positions [r·n/d, (r+1)·n/d) of each
bucket. The reduce-scatter's result is written back into that range of the bucket, so the owned slice of the
bucket is the "main gradient" (Megatron's, for fp32 grads) and costs nothing extra; the rest of the bucket
holds this rank's unreduced gradients and is not read again. AdamW updates the model's own parameter arrays
through flat views of the owned slices: in fp32/fp64 the parameter is the main parameter.

Mixed precision (a bfloat16/float16 model, ``tpsim.train.mixed_precision``), as Megatron's distributed optimizer
does it: the gradients are already float32 (the main gradients), so the buckets are float32 and reduce-scattered
in float32; ``main`` (the mixed-precision optimizer's ``MainParams``, one buffer per bucket) holds float32 main
parameters for the owned range of each bucket *only* (4 bytes, plus AdamW's float32 m and v: 12 bytes per
parameter ÷ d); AdamW steps them, they are rounded (nearest-even) into the model's 16-bit parameters, and the
all-gather moves the 16-bit parameters — 2 bytes per element, half the reduce-scatter's bytes. float16 adds the
loss scaler: ``unscale_grads`` unscales the owned slices and agrees found-inf once over the world (a skipped
step updates nothing and gathers nothing).

Traced: reduce-scatter scope ``zero.bucket{i}`` phase ``dp_sync``; all-gather scope ``zero.bucket{i}`` phase
``optimizer`` (it belongs to the update; Megatron may overlap it with the next forward); the clip norm scope
``clip_grad_norm`` phase ``optimizer``, group ``world``. With dp == 1 no DP collective is issued.

    zero = DistributedOptimizer(AdamW(model, lr=3e-4), grid)     # wraps any tpsim Optimizer
    zero = DistributedOptimizer(AdamW(fp16_model), grid, loss_scaler=DynamicLossScaler())  # 16 bits
    train_step(model, zero, grid, zero, ids, labels, clip=1.0)     # zero is also the gradient sync
"""

from __future__ import annotations

import math
from functools import partial
from typing import NamedTuple

import numpy as np

from tpsim.comm import ProcessGrid
from tpsim.nn.module import Partition
from tpsim.nn.precision import is_half
from tpsim.phases import OPTIMIZER
from tpsim.table import human_bytes
from tpsim.partition import owned_range, owned_segments
from tpsim.train.clip import check_norm_type, local_contribution, scale_grads
from tpsim.train.ddp import DEFAULT_BUCKET_CAP_BYTES, GradSync, Reduction
from tpsim.train.loss_scale import DynamicLossScaler, unscale_and_agree
from tpsim.train.mixed_precision import MainParams
from tpsim.train.optim import Optimizer
from tpsim.train.protocol import MAIN_PARAM, Overflow, StateSlice
from tpsim.train.zero2 import ShardedGrads
from tpsim.train.zero3 import ShardedParams, unit_groups
from tpsim.train.zero_comm import ZeroCommunication, flat_view
from tpsim.zero_stage import ZERO_STAGES


class OwnedSlice(NamedTuple):
    """One parameter's owned slice: flat views of the parameter, its gradient and its optimizer state."""

    name: str
    param: np.ndarray  # elements [start, stop) of the (main) parameter that the optimizer updates in place
    grad: np.ndarray  # the same elements' gradient: a view into the bucket, reduced by the reduce-scatter
    state: dict[str, np.ndarray]  # the optimizer's slots for these elements: views into the owned slice's state
    partition: Partition | None  # None: replicated over TP (counted on tp_rank 0 by the clip norm)
    decay: float  # the weight decay of this parameter
    at: int  # where the slice starts in this rank's owned range of the bucket
    start: int  # where the slice starts in the flattened parameter (its elements are [start, start + size))
    model: np.ndarray  # the model's own elements: ``param`` itself, or under mixed precision its 16-bit view


class DistributedOptimizer(ZeroCommunication):
    """ZeRO-1, 2 or 3 (``stage``) around a tpsim ``Optimizer`` (its update rule and hyper-parameters; its full
    state is dropped).

    Implements the optimizer protocol (``tpsim.train.protocol``) with ``zero_stage`` 1, 2 or 3, and is also the
    gradient sync of the step (``sync()``: the reduce-scatter), so it goes where a ``GradSync`` goes. ZeRO-2
    (``tpsim.train.zero2.ShardedGrads``, ``sharded``) keeps only the owned slices of the gradients: each bucket is
    reduce-scattered as its backward finishes it and freed, and the slices' gradients are views into the owned
    slices instead of into the buckets; the rest — clipping, the step, the parameter all-gather — is ZeRO-1's.
    ZeRO-3 (``tpsim.train.zero3.ShardedParams``, ``sharded_params``) cuts one bucket a unit and keeps only the owned
    slices of the parameters too: the slices step them in place, each unit gathers its bucket around its forward
    and its backward, and nothing is gathered after the step. Attributes:
    ``buckets``/``buffers`` (padded), ``owned`` (this rank's range of each bucket), ``slices``, ``main`` (the
    ``MainParams`` of the owned ranges: 16-bit models only, no buffers otherwise), ``loss_scaler``: float16's
    ``DynamicLossScaler`` (only for a 16-bit model).
    """

    def __init__(self, optimizer: Optimizer, grid: ProcessGrid,
                 bucket_cap_bytes: int | None = DEFAULT_BUCKET_CAP_BYTES, *,
                 loss_scaler: DynamicLossScaler | None = None, overlap_grad_reduce: bool = False,
                 overlap_param_gather: bool = False, held: tuple[np.ndarray, ...] = (), stage: int = 1) -> None:
        sharding = ZERO_STAGES.get(stage)  # what the stage shards, when it reduces and gathers
        if sharding is None or not sharding.shards_optimizer:
            raise ValueError(f"stage {stage}: the DistributedOptimizer runs ZeRO stage 1, 2 or 3")
        if overlap_grad_reduce and not sharding.overlap_grad_reduce_applies:
            raise ValueError(f"ZeRO-{stage} reduce-scatters each bucket during the backward already: no "
                             "overlap_grad_reduce")
        if overlap_param_gather and not sharding.overlap_param_gather_applies:
            raise ValueError(f"ZeRO-{stage} gathers each layer's parameters before its forward: no "
                             "overlap_param_gather")
        self.optimizer, self.grid, self.zero_stage = optimizer, grid, stage
        self.dp_group, self.dp = grid.dp_group, grid.replicas  # DP x CP under context parallelism
        model = optimizer.module
        self.half = any(is_half(p.dtype) for _, p in model.named_parameters())
        if loss_scaler is not None and not self.half:
            raise ValueError("a loss scaler needs a 16-bit (float16) model")
        self.loss_scaler, self.skipped = loss_scaler, False  # skipped: the last step, for an overflow
        self.grad_sync = GradSync(model, grid.dp_group, bucket_cap_bytes, pad_to=grid.replicas,
                                  overlap=overlap_grad_reduce, held=held,
                                  groups=partial(unit_groups, model) if sharding.buckets_at_units else None,
                                  reduction=Reduction(self._reduce_scatter, self._keep_owned))
        self.bucket_sizes = [len(buf) for buf in self.grad_sync.buffers]  # padded elements of each bucket
        self._reduced: dict[int, object] = {}  # bucket -> its posted reduce-scatter
        self.overlap_param_gather = overlap_param_gather and grid.replicas > 1
        self._gathering: list[tuple[int, object]] = []  # (bucket, posted all-gather) until finish_param_gather
        self._hooked: list = []  # the hooks making layers wait for them at their forward (their handles)
        self.buckets, self.buffers = self.grad_sync.buckets, self.grad_sync.buffers
        slots = optimizer.slots
        self.owned = [owned_range(n, self.dp, self.dp_group.rank) for n in self.bucket_sizes]
        # ZeRO-2: the buckets materialised only while a backward writes them, reduced into owned slices
        self.sharded = ShardedGrads(model, self.grad_sync, self.owned, self._reduce_into_owned,
                                    self.grad_sync.held) if sharding.shards_grads else None
        # ZeRO-3: the parameters' owned slices, each unit's bucket gathered around its forward and backward
        self.sharded_params = (ShardedParams(model, self.buckets, self.bucket_sizes, self.owned, self.dp_group)
                        if sharding.shards_params else None)
        if self.sharded is not None:
            self.grad_sync.hand_over(self.sharded.buffers)
            self.buffers = self.sharded.buffers  # None where a bucket is not materialised
        # flat optimizer state for the owned slice of each bucket, padding included (Megatron's shard)
        self.slot_buffers = [{s: np.zeros(len(mine), bucket.dtype) for s in slots}
                             for mine, bucket in zip(self.owned, self.buckets)]
        # 16 bits only: the float32 main parameters of the owned ranges (fp32/fp64 slices are their own main)
        self.main = MainParams([len(mine) for mine in self.owned] if self.half else [])
        self.slices: list[list[OwnedSlice]] = [self._slices(b) for b in range(len(self.buckets))]
        optimizer.release_state()  # the full-size state is never used: the owned slices' state replaces it

    def _slices(self, b: int) -> list[OwnedSlice]:
        """The slices of bucket ``b``'s parameters that fall into this rank's owned range, in packing order."""
        model, bucket, buf, mine = self.optimizer.module, self.buckets[b], self.buffers[b], self.owned[b]
        params, partitions = dict(model.named_parameters()), dict(model.named_partitions())
        parts = []
        for seg in owned_segments([params[n].size for n in bucket.names], self.dp, self.dp_group.rank):
            name, at, size = bucket.names[seg.index], seg.buffer_start - mine.start, seg.stop - seg.start
            state = {s: arr[at:at + size] for s, arr in self.slot_buffers[b].items()}
            grad = (self.sharded.owned[b][at:at + size] if self.sharded is not None
                    else buf[seg.buffer_start:seg.buffer_start + size])
            own = (self.sharded_params.owned[b][at:at + size] if self.sharded_params is not None
                   else flat_view(params[name])[seg.start:seg.stop])
            # 16 bits: the float32 main parameter of this slice, made once from the 16-bit weights
            param = self.main.add(b, at, own) if self.half else own
            parts.append(OwnedSlice(name, param, grad, state, partitions[name], self.optimizer.decay_for(name), at,
                                seg.start, own))
        return parts

    # --- the optimizer protocol (tpsim.train.protocol) ----------------------------------------------------------
    @property
    def rule(self) -> Optimizer:
        return self.optimizer

    @property
    def lr(self) -> float:
        return self.optimizer.lr

    @lr.setter
    def lr(self, value: float) -> None:
        self.optimizer.lr = value

    @property
    def step_count(self) -> int:
        return self.optimizer.step_count

    @property
    def loss_scale(self) -> float:
        """What to multiply the loss gradient by before the backward (1.0 without a scaler)."""
        return 1.0 if self.loss_scaler is None else self.loss_scaler.scale

    @property
    def total_bytes(self) -> int:
        """Bytes of the padded gradient buckets: what is reduce-scattered, and all-gathered, per step."""
        return self.grad_sync.total_bytes

    def state_bytes(self) -> int:
        """Optimizer-state bytes on this rank: the slots over its owned slices (1/d of the buckets), and under
        mixed precision the float32 main parameters of the same slices."""
        return sum(a.nbytes for slots in self.slot_buffers for a in slots.values()) + self.main.nbytes

    def grad_bytes(self) -> int:
        """Gradient bytes held here beside the model's arrays: ZeRO-2's owned slices (ZeRO-1: none, its owned
        slices are ranges of the model's buckets)."""
        return self.sharded.nbytes if self.sharded is not None else 0

    def param_bytes(self) -> int:
        """Parameter bytes held here beside the model's arrays: ZeRO-3's owned slices (else none)."""
        return self.sharded_params.nbytes if self.sharded_params is not None else 0

    def state_dict(self) -> dict:
        """``{"step", "dp", "slots"}``: this DP rank's shard of the state (one dict of slot arrays per bucket), as
        Megatron saves a distributed optimizer per DP rank; it loads only at the same dp and bucket layout."""
        sd = {"step": self.step_count, "dp": self.dp,
              "slots": [{k: v.copy() for k, v in slots.items()} for slots in self.slot_buffers]}
        if self.half:  # mixed precision: the float32 main parameters of the owned ranges (and the loss scale)
            sd["main"] = self.main.state_dict()
        if self.loss_scaler is not None:
            sd["loss_scaler"] = self.loss_scaler.state_dict()
        return sd

    def load_state_dict(self, sd: dict) -> None:
        if sd["dp"] != self.dp or len(sd["slots"]) != len(self.slot_buffers):
            raise ValueError(f"a shard saved at dp {sd['dp']} with {len(sd['slots'])} buckets does not fit dp "
                             f"{self.dp} with {len(self.slot_buffers)} buckets")
        for mine, saved in zip(self.slot_buffers, sd["slots"]):
            for k, v in mine.items():
                if saved[k].shape != v.shape:
                    raise ValueError(f"slot {k}: shape {saved[k].shape} != {v.shape} (another bucket layout?)")
                np.copyto(v, saved[k])  # into the existing arrays: the slices hold views of them
        self.main.load_state_dict(sd.get("main", []))
        if self.loss_scaler is not None and "loss_scaler" in sd:
            self.loss_scaler.load_state_dict(sd["loss_scaler"])
        self.optimizer.step_count = int(sd["step"])

    def zero_grad(self) -> None:
        self.optimizer.module.zero_grad()  # the views are filled in place; the padding is never written

    # --- the three phases of a step ----------------------------------------------------------------------------
    def _all_slices(self):
        return (part for parts in self.slices for part in parts)

    def unscale_grads(self) -> Overflow:
        """After the reduce-scatter, float16 only: unscale the owned gradients and agree on overflow over the
        world (one all-reduce, scope ``loss_scaler``)."""
        self.skipped = False
        if self.loss_scaler is not None:
            self.skipped = unscale_and_agree([p.grad for p in self._all_slices()], self.loss_scaler, self.grid.world)
        return Overflow(self.skipped, self.skipped and self.loss_scaler.at_minimum)

    def grad_norm(self, grid: ProcessGrid, norm_type: float = 2.0) -> float:
        """The serial model's gradient norm from the owned slices: one all-reduce over the whole world.

        Each element of a TP shard is owned by exactly one DP rank, so summing the slices over DP and TP counts
        it once; a TP-replicated parameter is counted by ``tp_rank == 0`` only, as ``clip.grad_norm`` does.
        """
        p = check_norm_type(norm_type)
        entries = [(part.name, part.grad, part.partition) for part in self._all_slices()]
        local = local_contribution(entries, p, count_replicated=grid.tp_rank == 0)
        with grid.tracer.region(scope="clip_grad_norm", phase=OPTIMIZER):
            total = float(grid.world.all_reduce(np.array([local]), op="max" if math.isinf(p) else "sum")[0])
        return total if math.isinf(p) else total ** (1.0 / p)

    def clip_grads(self, max_norm: float, norm: float) -> None:
        """Scale the owned gradients (views into the buckets) so the global norm is at most ``max_norm``."""
        scale_grads([part.grad for part in self._all_slices()], max_norm, norm)

    def step(self) -> None:
        """Update the owned slices with the wrapped optimizer's rule (16 bits: the float32 main slices, then
        rounded into the model's), then all-gather the parameters."""
        self.optimizer.step_slices((p.param, p.grad, p.state, p.decay) for p in self._all_slices())
        self.main.round_into_model()
        if self.sharded is not None:  # ZeRO-2: buckets a caller gathered gradients into (gather_grads) go
            self.sharded.free_all()
        if self.sharded_params is not None:  # ZeRO-3: the owned slices are the parameters; whole ones are stale now
            self.sharded_params.hook()
            return
        self.gather_params()

    def state_slices(self) -> list[StateSlice]:
        """The owned slices' slots; under mixed precision with their float32 main parameters (``main_param``)."""
        return [StateSlice(p.name, p.start, {**p.state, MAIN_PARAM: p.param} if self.half else p.state)
                for p in self._all_slices()]

    def describe(self) -> str:
        """The buckets, the owned range of each on this rank, and the state bytes, as text."""
        lines = [f"ZeRO-{self.zero_stage} over DP({self.dp}): {len(self.buckets)} bucket(s), "
                 f"{self.total_bytes} bytes of gradients "
                 f"(padded to a multiple of {self.dp}), optimizer state {human_bytes(self.state_bytes())} per rank"]
        for i, (bucket, mine) in enumerate(zip(self.buckets, self.owned)):
            lines.append(f"  bucket {i}: {self.bucket_sizes[i]:>8} elements, this rank owns "
                         f"[{mine.start}, {mine.stop}): {len(self.slices[i])} parameter slice(s)")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return (f"DistributedOptimizer(stage={self.zero_stage}, dp={self.dp}, buckets={len(self.buckets)}, "
                f"state_bytes={self.state_bytes()})")
