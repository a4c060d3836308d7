"""The demo's final-state verdict: after the last step, the parallel model against its serial twin.

Step 0's check (gradients before any update) cannot see a bug that only acts once the weights move: a bias
added on every TP rank before the row-parallel all-reduce (biases start at zero), replicated gradients counted
twice in the clipping norm, AdamW's weight decay folded into the gradient. So, after training, one rank trains
the *serial* model through the same steps — the same global batches, the same dropout masks (the exact RNG
keys them by global position), the same clipping threshold and AdamW settings — and every rank compares its
state with it: the last loss, every parameter shard and AdamW's ``exp_avg`` and ``exp_avg_sq`` per shard.

The twin's clipping and AdamW update are written from their published definitions (PyTorch's
``clip_grad_norm_`` rule; Loshchilov & Hutter 2019, decoupled weight decay, in ``torch.optim.AdamW``'s form) in
``tpsim.train.reference``, on purpose apart from the training code: a reference that called the training
code's optimizer would share its bugs. Only one rank trains
it — a world of 64 ranks on a few cores must not train 64 serial copies — and its state reaches the others in
one flat float64 broadcast, with the tracer paused: verification is not model traffic. That rank is the last
one (``twin_rank``), so that rank 0 can write the run's files and figures meanwhile on another core
(``tpsim.demo.tour.run``); the others sleep in the broadcast.

How close is close enough depends on the training, which amplifies last-bit differences a little or
exponentially. Within step 0's tolerance, the run matches. Beyond it, the last three ranks train the serial
model again at once, each from starting weights one unit in the last place away (three sign patterns), and the
run must stay within ten times the farthest of them from the twin: the noise floor of this very training
(``tpsim.demo.noise_floor``, where the rule is stated and its numbers measured). Where the floor is as large as
a bug's effect, the verdict says it cannot decide, rather than calling the run equal or different.
"""

from __future__ import annotations

import math
import time
from typing import Callable, Sequence

import numpy as np

from tpsim.comm import ProcessGrid
from tpsim.comm.agree import Agreement
from tpsim.data import ReverseTask
from tpsim.compare import relative_difference
from tpsim.config import RunConfig
from tpsim.demo.noise_floor import (DECIDABLE, KINDS, NOISE_FACTOR, SIGNS_SEEDS, floor_ranks, judge, nudge,
                                    state_differences, tolerance)
from tpsim.demo.report import grid_label, say
from tpsim.demo.resume import serial_start
from tpsim.demo.tolerances import TOLERANCE
from tpsim.nn.dropout import DropoutPlan
from tpsim.partition import take_shard
from tpsim.table import format_table
from tpsim.tp.random import ExactDropoutRNG
from tpsim.train.optim import AdamW
from tpsim.train.protocol import OptimizerProtocol
from tpsim.train.reference import reference_adamw, reference_clip

# 16 bits, step 0's gradient norm vs the serial model's (``_check_first_norm``): the norm is a function of the
# gradients step 0's verdict already holds to TOLERANCE, so it is held to the same (a fixed 1e-3 failed a small
# bfloat16 GPT — 4 layers, h 32 — at 1.12e-3 with nothing wrong; the demo's defaults measure ≤ 1.2e-5). What the
# check is for, a norm taken before unscaling, is off by the loss scale itself (2^16), far beyond either.
FIRST_NORM_TOLERANCE = {dtype: TOLERANCE[dtype] for dtype in ("bfloat16", "float16")}
STATE = KINDS[1:]  # ("param", "exp_avg", "exp_avg_sq"): what is compared per parameter, in the broadcast's order


def twin_rank(grid: ProcessGrid) -> int:
    """The rank that trains the serial twin: the last, so rank 0 is free to write the run's files meanwhile."""
    return grid.world_size - 1


def broadcast_arrays(grid: ProcessGrid, shapes: Sequence[tuple[int, ...]],
                     make: Callable[[], Sequence], root: int = 0) -> list[np.ndarray]:
    """Arrays of ``shapes`` that ``make()`` computes on (world) rank ``root`` only, on every rank from one float64
    broadcast (exact for float32 too), the tracer paused: a serial reference is computed once, not once per rank."""
    return broadcast_from(grid, [(shapes, make, root)])[0]


def broadcast_from(grid: ProcessGrid, jobs: Sequence[tuple[Sequence[tuple[int, ...]], Callable[[], Sequence], int]]
                   ) -> list[list[np.ndarray]]:
    """``broadcast_arrays`` for several ``(shapes, make, root)``: every rank computes the jobs it roots before the
    first broadcast, so jobs rooted on different ranks are computed at the same time."""
    sizes = [[math.prod(s) for s in shapes] for shapes, _, _ in jobs]
    flats = [np.empty(sum(n)) for n in sizes]
    with grid.tracer.paused():  # verification, not model traffic
        for flat, (_, make, root) in zip(flats, jobs):
            if grid.rank == root:
                np.concatenate([np.ravel(a) for a in make()], out=flat, casting="same_kind")
        for flat, (_, _, root) in zip(flats, jobs):
            grid.world.broadcast(flat, root=root, patient=True)  # the others sleep while a root trains, not spin
    return [[part.reshape(s) for part, s in zip(np.split(flat, np.cumsum(n)[:-1]), shapes)]
            for flat, n, (shapes, _, _) in zip(flats, sizes, jobs)]


def train_serial(run: RunConfig, task, optimizer: AdamW, skipped: frozenset[int] = frozenset(),
                 nudged: int | None = None) -> list:
    """On the twin rank: the serial model trained ``run``'s steps (with ``--resume``, from the saved state and step
    on); ``[last loss, params..., exp_avg..., exp_avg_sq...]``.

    ``optimizer`` is the parallel run's AdamW: only its settings are read (lr, betas, eps, which parameters decay).
    A step whose loss or norm is not finite is skipped, as the training loop skips it, and so is every step in
    ``skipped`` (the steps the parallel run skipped: a fault injected there, or float16's loss-scale overflow).
    ``nudged``: a sign seed; from starting weights one ulp away in that pattern (``noise_floor.nudge``).
    """
    sch = run.schedule
    serial = run.serial_model()
    start, t, m, v = serial_start(run, serial)  # --resume: its parameters, AdamW state, step and step count
    names = [name for name, _ in serial.named_parameters()]
    params, grads = [p for _, p in serial.named_parameters()], [g for _, g in serial.named_grads()]
    if nudged is not None:
        nudge(params, nudged)
    if m is None:
        m, v = [np.zeros_like(p) for p in params], [np.zeros_like(p) for p in params]
    rng, loss = ExactDropoutRNG(sch.seed), float("nan")
    for step in range(start, sch.steps):
        ids, labels = task.batch(sch.seed, step, sch.batch_size)
        loss = serial.loss_and_grads(ids, labels, DropoutPlan(rng, step))
        norm = reference_clip(grads, run.optimizer.max_norm or math.inf)
        if step in skipped or not (math.isfinite(loss) and math.isfinite(norm)):
            continue
        t += 1
        for i, name in enumerate(names):
            reference_adamw(params[i], grads[i], m[i], v[i], t, optimizer.lr, optimizer.betas, optimizer.eps,
                            optimizer.decay_for(name))
    return [loss, *params, *m, *v]


def _optimizer_state(optimizer: OptimizerProtocol):
    """``(name, start, (exp_avg, exp_avg_sq))`` for the AdamW state this rank holds: whole shards, or under
    ZeRO-1 the owned slices, ``start`` their offset in the flattened shard (``state_slices``)."""
    return [(p.name, p.start, (p.slots["exp_avg"], p.slots["exp_avg_sq"])) for p in optimizer.state_slices()]


def _differences(model, optimizer: OptimizerProtocol,
                 serial: dict[str, list[np.ndarray]]) -> dict[tuple[str, str], float]:
    """``{(what, name): difference}`` of this rank's shards vs their slices of the serial tensors, each relative
    to the largest serial value of its kind in the whole model (``relative_difference`` with that floor).

    Per kind, not per tensor: attention's key bias has a gradient that is exactly zero in exact arithmetic
    (softmax ignores a shift shared by a query's scores), so it only ever holds rounding noise that Adam scales
    up to lr-sized steps; measured against its own tiny values, noise would read as a 100% difference."""
    scale = {what: max(float(np.max(np.abs(t[i]), initial=0.0)) for t in serial.values())
             for i, what in enumerate(STATE)}
    out = {}
    for e in model.named_entries():
        expected = take_shard(serial[e.name][0], e.partition)
        out[STATE[0], e.name] = relative_difference(e.param, expected, floor=scale[STATE[0]] or 1e-30)
    partitions = dict(model.named_partitions())
    for name, start, local in _optimizer_state(optimizer):
        partition = partitions[name]
        for what, mine, full in zip(STATE[1:], local, serial[name][1:]):
            expected = take_shard(full, partition).reshape(-1)[start:start + mine.size]
            key = (what, name)
            out[key] = max(out.get(key, 0.0), relative_difference(mine.reshape(-1), expected,
                                                                 floor=scale[what] or 1e-30))
    return out


def final_verdict(grid: ProcessGrid, model, optimizer: OptimizerProtocol, run: RunConfig,
                  metrics: list[dict]) -> bool | None:
    """Print the state after the last step vs the serial twin (see the module docstring), then how to check
    sequence parallelism where it was off; True iff the state matches on every rank (or cannot be checked:
    Megatron dropout, 16 bits), False on a mismatch, None where the noise floor is too high to decide."""
    ok = _check_final_state(grid, model, optimizer, run, metrics)
    if not run.parallel.sp:
        say(grid, f"(sequence parallelism was off; check it too: mpirun -n {grid.world_size} python -m tpsim.demo "
                  "--sequence-parallel)")
    return ok


def _check_first_norm(grid: ProcessGrid, run: RunConfig, first: dict) -> bool:
    """16 bits: step 0's ``|grad|`` (measured after unscaling) against the serial model's gradient norm on the
    same batch — one forward and backward on the twin rank from the loss scale S, the norm ÷ S — within step 0's
    tolerance. Steps that clip before they unscale report S·‖g‖ (1.49e+05 instead of 2.278 at S = 2^16), which
    step 0's gradient check cannot see (it compares the scaled gradients). Prints only on a mismatch: the line
    above already says what the 16-bit checks are."""
    if first["skipped"] or first["grad_norm"] is None:
        return True  # an overflow at step 0: nothing was measured
    scale, sch, dtype, step = first.get("loss_scale", 1.0), run.schedule, run.precision.dtype, first["step"]

    def serial_norm():
        serial = run.serial_model()
        serial_start(run, serial)  # the parameters of the run's first step
        ids, labels = ReverseTask(run.model.vocab, sch.seq_len).batch(sch.seed, step, sch.batch_size)
        serial.zero_grad()
        _, cache = serial.forward(ids, labels, DropoutPlan(ExactDropoutRNG(sch.seed), step))
        serial.backward(scale, cache)
        return [reference_clip([g for _, g in serial.named_grads()], math.inf) / scale]

    expected = float(broadcast_arrays(grid, [()], serial_norm, twin_rank(grid))[0])
    diff = relative_difference(first["grad_norm"], expected, floor=0.0)
    ok = bool(diff <= FIRST_NORM_TOLERANCE[dtype])
    if not ok:
        say(grid, f"VERDICT: MISMATCH — step {step}'s |grad| {first['grad_norm']:.4g} differs from the serial "
                  f"model's {expected:.4g} by {diff:.2e} (tolerance {FIRST_NORM_TOLERANCE[dtype]:g}, {dtype}): are "
                  "the gradients unscaled before they are measured and clipped?")
    return ok


def _check_final_state(grid, model, optimizer, run: RunConfig, metrics) -> bool | None:
    if not metrics:
        return True  # --steps 0: step 0's verdict is the final one
    dtype, steps, first = run.precision.dtype, run.schedule.steps, metrics[0]["step"]  # first: > 0 when resumed
    span = f"{steps} steps" if first == 0 else f"steps {first}..{steps - 1}"
    if run.dropout > 0 and run.schedule.dropout_rng == "megatron":
        say(grid, "", "Final state vs the serial model: not checked — Megatron dropout masks depend on the shard, "
                      "so no serial run draws the same masks (--dropout-rng exact can be checked)")
        return True
    if run.precision.half:
        say(grid, "", f"Final state vs the serial model: not checked in {dtype} — TP rounds its partial sums in "
                      "another order than serial, and training amplifies the difference (README: \"Why the loss "
                      "changes with TP\"); step 0 above is the check, within the dtype's tolerance")
        return _check_first_norm(grid, run, metrics[0])
    shapes = list(run.model.param_shapes().items())
    settings = optimizer.rule  # the AdamW whose settings the twin reads
    skipped = frozenset(m["step"] for m in metrics if m.get("skipped"))
    root, task = twin_rank(grid), ReverseTask(run.model.vocab, run.schedule.seq_len)

    def timed_twin():
        t0 = time.perf_counter()
        loss, *state = train_serial(run, task, settings, skipped)
        return [loss, *state, time.perf_counter() - t0]  # its own time: rank 0 may join the broadcast late

    *exact, seconds = broadcast_arrays(grid, [(), *[s for _, s in shapes] * len(STATE), ()], timed_twin, root)
    loss, state = float(exact[0]), exact[1:]
    serial = {name: state[i::len(shapes)] for i, (name, _) in enumerate(shapes)}
    diffs = _differences(model, optimizer, serial)
    by_kind = [max(d for (w, _), d in diffs.items() if w == k) for k in STATE]
    with grid.tracer.paused():
        agree = Agreement(grid.world)
        worst = agree.reduce([relative_difference(metrics[-1]["loss"], loss, floor=0.0), *by_kind])
        where = agree.gather(max((d, what, name, grid.rank) for (what, name), d in diffs.items()))
    step0, floor = TOLERANCE[dtype], None
    if not np.all(worst <= step0):  # is the difference rounding grown by this training? its noise floor says
        def timed_floor(seed: int):
            def train():
                t0 = time.perf_counter()
                return [*state_differences(train_serial(run, task, settings, skipped, nudged=seed), exact),
                        time.perf_counter() - t0]
            return train

        ranks = floor_ranks(grid.world_size)
        runs = np.array(broadcast_from(grid, [([()] * (len(KINDS) + 1), timed_floor(seed), r)
                                              for seed, r in zip(SIGNS_SEEDS, ranks)]), dtype=float)
        floor, floor_seconds = runs[:, :-1].max(axis=0), runs[:, -1].max()  # per kind, the largest of the patterns
    tol = tolerance(floor, step0)
    verdict = judge(worst, tol)
    if grid.rank == 0:
        _, what, name, rank = max(where)
        say(grid, "", f"Final state vs the serial model trained the same {span} on rank {root} (same "
                      f"batches, dropout masks, clipping and AdamW; {float(seconds):.1f} s):",
            f"  serial loss at step {metrics[-1]['step']} {loss:.12{'f' if abs(loss) < 1e5 else 'g'}}",
            *_difference_table(worst, floor, f"(worst: {what} of {name}, rank {rank})",
                               None if floor is None else f"ranks {', '.join(map(str, sorted(set(ranks))))}, "
                                                          f"{float(floor_seconds):.1f} s"),
            _verdict_line(verdict, floor, tol, step0, f"{grid_label(grid)} after {span}",
                          f"{dtype}; loss, {len(shapes)} parameters, AdamW state"))
    return verdict


def _difference_table(worst, floor, where: str, floor_time: str | None) -> list[str]:
    """Per kind: the parallel run's largest relative difference from the twin over every shard on every rank,
    and, where it was measured, the noise floor (the nudged twin's difference from the twin)."""
    rows = [["", *KINDS], ["parallel vs serial", *(f"{d:.2e}" for d in worst)]]
    if floor is not None:
        rows.append(["noise floor", *(f"{float(d):.2e}" for d in floor)])
    lines = ["  " + line for line in format_table(rows).split("\n")]
    lines[1] += f"   {where}"
    if floor is not None:
        lines[2] += (f"   (the largest of {len(SIGNS_SEEDS)} serial runs from weights one ulp away; "
                     f"{floor_time})")
    return lines


def _verdict_line(verdict: bool | None, floor, tol: float, step0: float, what: str, detail: str) -> str:
    """MATCH, MISMATCH or NOT DECIDED (``tpsim.demo.noise_floor``'s rule), in one line."""
    rule = ("step 0's: no difference is beyond it" if floor is None else
            f"{NOISE_FACTOR:g} x the noise floor, at least step 0's {step0:g}")
    if verdict is None:
        kind = int(np.argmax(floor))
        return (f"VERDICT: NOT DECIDED — {what}: rounding alone grows to {float(floor[kind]):.1e} ({KINDS[kind]}) "
                f"in this training, and {NOISE_FACTOR:g} x that is above the {DECIDABLE:g} that could pass a bug; "
                "step 0 above is the check (fewer --steps or --layers, or a smaller --lr, make the final state "
                f"checkable; {detail})")
    return (f"VERDICT: {'MATCH' if verdict else 'MISMATCH'} — {what} "
            f"{'equals' if verdict else 'differs from'} the serial model trained the same way, tolerance {tol:.2g} "
            f"({rule}; {detail})")
