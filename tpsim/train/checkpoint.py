"""A training checkpoint's optimizer state, unsharded: gathered from any layout, cut again for any other.

Whatever the layout, every optimizer lists the state this rank holds as ``StateSlice``s (``tpsim.train.protocol``):
AdamW's ``exp_avg`` and ``exp_avg_sq`` over a whole TP shard, or under ZeRO-1 over the slice of it this DP rank
owns, and for a 16-bit model the float32 main parameter (slot ``main_param``). Each slot of each parameter is
put back together as the serial model's tensor, the way the parameters themselves are (``tpsim.hf.checkpoint``):

    1. slice -> shard     the slice at its offset in a zero shard-shaped array; under ZeRO-1 the DP ranks own
                          disjoint slices, so one sum over the DP group completes every shard (exact: each
                          element has one non-zero term)
    2. shard -> tensor    over the TP group along the parameter's Partition, vocabulary padding cut
                          (``tpsim.hf.checkpoint.gather_full``); an expert's over ETP, then EP
                          (``tpsim.train.gather_folded``)
    3. stages -> model    the stages' tensors meet on rank 0 (a tied embedding's state comes from the first and
                          the last stage: the same numbers, both stepped with the summed gradient)

Loading is the inverse and needs no communication: each rank cuts its shard (``take_shard``: padded rows zero,
as a straight run keeps them) and its slice of it. Gathering is collective and untraced (the tracer paused):
saving is not training traffic, so comm.jsonl and the FORMULA CHECK stay those of training alone.

Keys of the full state: ``"<slot>.<parameter name>"`` (``state_key``), e.g. ``exp_avg.transformer.h.0.mlp.c_fc.weight``.
"""

from __future__ import annotations

import numpy as np

from tpsim.comm import ProcessGrid
from tpsim.hf.checkpoint import CheckpointError
from tpsim.nn.module import Module
from tpsim.nn.precision import grad_dtype, is_half
from tpsim.partition import take_shard
from tpsim.train.gather_folded import gather_folded
from tpsim.train.protocol import MAIN_PARAM, OptimizerProtocol, zero_of


def state_key(slot: str, name: str) -> str:
    return f"{slot}.{name}"


def state_slots(optimizer: OptimizerProtocol, model: Module) -> list[str]:
    """The slots every parameter has: the rule's (AdamW: exp_avg, exp_avg_sq), and ``main_param`` for a 16-bit
    model. From the rule and the dtype, not from the slices: a ZeRO-1 rank may own no slice at all."""
    half = any(is_half(p.dtype) for _, p in model.named_parameters())
    return [*optimizer.rule.slots, *([MAIN_PARAM] if half else [])]


def _local_shards(model: Module, optimizer: OptimizerProtocol, slots: list[str]) -> dict[str, dict[str, np.ndarray]]:
    """``{slot: {name: shard-shaped array}}``: this rank's slices placed in zeros (step 1 above)."""
    shards = {slot: {name: np.zeros(p.shape, grad_dtype(p.dtype)) for name, p in model.named_parameters()}
              for slot in slots}
    for part in optimizer.state_slices():
        for slot, values in part.slots.items():
            flat = shards[slot][part.name].reshape(-1)
            flat[part.start:part.start + values.size] = values.reshape(-1)
    return shards


def _sum_over_dp(shards: dict[str, dict[str, np.ndarray]], grid: ProcessGrid) -> None:
    """ZeRO-1: every shard completed by one sum over DP (per dtype, one flat buffer each), in place."""
    arrays = [a for by_name in shards.values() for a in by_name.values()]
    for dtype in sorted({a.dtype for a in arrays}, key=str):
        mine = [a for a in arrays if a.dtype == dtype]
        total = grid.dp_group.all_reduce(np.concatenate([a.reshape(-1) for a in mine]), op="sum")
        offset = 0
        for a in mine:
            a.reshape(-1)[...] = total[offset:offset + a.size]
            offset += a.size


def gather_state(model: Module, optimizer: OptimizerProtocol, grid: ProcessGrid) -> dict[str, np.ndarray] | None:
    """The full optimizer state by ``state_key`` on world rank 0 (None elsewhere), in the state's dtype.

    Collective over the whole grid (every rank calls it), untraced. ``model`` is this rank's TP model or
    pipeline stage (``PipelineShard``); its ``config.param_shapes()`` gives the true shapes."""
    slots = state_slots(optimizer, model)
    with grid.tracer.paused():
        shards = _local_shards(model, optimizer, slots)
        if zero_of(optimizer).shards_optimizer:
            _sum_over_dp(shards, grid)
        all_shapes = model.config.param_shapes()
        shapes = {name: all_shapes[name] for name, _ in model.named_parameters()}
        mine = {state_key(slot, name): a for slot in slots  # experts: over ETP and EP too
                for name, a in gather_folded(model, shards[slot], shapes, grid).items()}
        first_chain = grid.replica_rank == 0 and grid.tp_rank == 0  # one rank per stage: rank 0's pipeline group
        stages = grid.pp_group.gather_objects(mine if first_chain else {}, root=0)
    if grid.rank != 0:
        return None
    out: dict[str, np.ndarray] = {}
    for tensors in stages:
        out.update(tensors)
    return {state_key(slot, name): out[state_key(slot, name)] for slot in slots for name in all_shapes}


def check_state(state: dict[str, np.ndarray], slots: list[str], shapes: dict[str, tuple[int, ...]],
                dtype, label: str) -> None:
    """Raise ``CheckpointError`` unless ``state`` holds exactly every slot of every parameter, each of the
    parameter's shape and the state's ``dtype`` (pure: every rank reaches the same verdict)."""
    want = {state_key(slot, name): tuple(shape) for slot in slots for name, shape in shapes.items()}
    problems = [f"missing {key}" for key in want if key not in state]
    problems += [f"unexpected {key}" for key in state if key not in want]
    problems += [f"{key} has shape {state[key].shape}, expected {shape}" for key, shape in want.items()
                 if key in state and state[key].shape != shape]
    problems += [f"{key} is {state[key].dtype}, this run's optimizer state is {np.dtype(dtype)}"
                 for key in want if key in state and state[key].dtype != np.dtype(dtype)]
    if problems:
        more = f"; and {len(problems) - 3} more" if len(problems) > 3 else ""
        raise CheckpointError(f"{label}: " + "; ".join(problems[:3]) + more)


def load_state(model: Module, optimizer: OptimizerProtocol, state: dict[str, np.ndarray], *, step_count: int,
               loss_scaler: dict | None) -> None:
    """Cut this rank's slices of the full ``state`` into the optimizer's live arrays (no communication), and set
    the rule's step count (Adam's bias corrections) and the loss scaler's state (float16)."""
    parts = dict(model.named_partitions())
    for part in optimizer.state_slices():
        for slot, values in part.slots.items():
            shard = take_shard(state[state_key(slot, part.name)], parts[part.name]).reshape(-1)
            values[...] = shard[part.start:part.start + values.size].reshape(values.shape)
    optimizer.rule.step_count = int(step_count)
    if (optimizer.loss_scaler is None) != (loss_scaler is None):
        raise CheckpointError("the checkpoint's loss scaler does not fit this run's: float16 scales the loss, "
                              "every other dtype does not")
    if loss_scaler is not None:
        optimizer.loss_scaler.load_state_dict(loss_scaler)
