"""The demo's one training loop, for every layout: the loop, and the step's work it calls.

Megatron-LM runs one loop around a forward-backward function it picks by the pipeline size
(``get_forward_backward_func``). tpsim runs every layout, ``--pp 1`` included, as a schedule through the same
executor, so there is one step's work (``StepWork``), ``tpsim.demo.tour.PipelineWork``: this stage's batch, the
schedule's micro-batches through the executor (at ``--pp 1``: one stage's F and B), the DP sync, the virtual
clock's spans kept for the timeline. ``train`` takes it as an argument, so a test or a lesson can pass its own.

Each step, for steps ``start`` (0, or where ``--resume`` stopped) to ``--steps``:

    gradients      work.grads(step, rng, loss scale) -> (loss, tokens, extra metrics)
    first step     ZeRO's owned slices gathered (phase verify), then the check against the serial model (and
                   ``--export``): ``first_step(grid, model, run, loss, scale, start)``
    update         clip and AdamW (``tpsim.train.apply_update``), the non-finite guard, float16's loss scale
    metrics        the step's loss, norm, tokens, wall time and collective bytes (``metrics.jsonl``)

after which the optimizer state table is taken at rest (before ZeRO-3 gathers the whole model) and the last
step's overlapped parameter all-gathers are waited for.
"""

from __future__ import annotations

import time
from typing import Callable, Protocol

from tpsim.demo.optimizer_setup import demo_guard, demo_optimizer, scaler_metrics
from tpsim.demo.report import say
from tpsim.demo.resume import restore
from tpsim.demo.zero_demo import state_table
from tpsim.table import human_bytes
from tpsim.tp.random import make_dropout_rng
from tpsim.train import apply_update
from tpsim.train.nonfinite import report_skip


class StepWork(Protocol):
    """One step's gradients, the part of the loop that depends on the layout (module docstring)."""

    moved: str  # how the step line names its collective bytes ("collectives/rank", "moved by rank 0")

    def grads(self, step: int, rng, loss_scale: float) -> tuple[float, int, dict]:
        """The step's batch read, its gradients made and DP-synced: ``(loss, tokens, extra metrics)``."""

    def notes(self) -> list[str]:
        """Lines said after the last step, before the optimizer's state table."""


def number(x: float, width: int, digits: int) -> str:
    """A step line's loss or norm: fixed-point, or scientific once a diverging run makes it huge."""
    return f"{x:{width}.{digits}{'f' if abs(x) < 1e5 else 'g'}}"


def train(grid, model, grad_sync, run, work: StepWork, first_step: Callable, resume=None):
    """``--steps`` steps of AdamW on ``model`` (the first checked by ``first_step``), from step 0 or where
    ``resume`` (a ``tpsim.demo.resume.Resume``) stopped: each step's metrics, the first step's verdict and the
    optimizer (its state is checked after the last step)."""
    tracer, sch = grid.tracer, run.schedule
    optimizer = demo_optimizer(model, grid, run, grad_sync)  # ZeRO: grad_sync itself
    start = restore(model, optimizer, resume)  # 0, or the saved step with the saved optimizer state
    scale = optimizer.loss_scale  # float16: the dynamic loss scale; 1 otherwise
    rng = make_dropout_rng(sch.dropout_rng, sch.seed, grid.tp_rank)
    clip, metrics, ok, guard = run.optimizer.max_norm, [], True, demo_guard(run)
    for step in range(start, max(sch.steps, 1)):
        tracer.step = step
        t0 = time.perf_counter()
        with guard.quiet():  # a diverging run is reported by the guard, not by NumPy warnings
            loss, tokens, extra = work.grads(step, rng, scale)
        if step == start:
            grad_sync.gather_grads()  # ZeRO reduced owned slices only: gather them (phase verify) to check all
            ok = first_step(grid, model, run, loss, scale, start)
            if sch.steps == 0:
                break
        with tracer.span("optimizer", "optimizer"):
            norm = apply_update(model, optimizer, grid, clip, guard=guard, loss=loss)
        report_skip(guard, model, step, loss, norm, lambda line: say(grid, line))  # stops after too many
        scale = optimizer.loss_scale
        dt = time.perf_counter() - t0
        moved = sum(e.bytes for e in tracer.events if e.step == step)
        # tokens: the global batch's target tokens, the ones the loss counts; tokens_processed: every position
        # the model ran forward and backward (global batch x seq), which is what tokens_per_s divides by dt
        processed = sch.batch_size * sch.seq_len
        metrics.append({"step": step, "loss": loss, "grad_norm": norm, "tokens": tokens, "tokens_processed": processed,
                        "seconds": dt, "tokens_per_s": processed / dt, "collective_bytes_per_rank": moved,
                        **scaler_metrics(optimizer), "skipped": guard.last.skipped, **extra})
        if (step % max(1, sch.steps // 10) == 0 or step == sch.steps - 1) and not guard.last.skipped:
            say(grid, f"  step {step:4d}  loss {number(loss, 7, 4)}  |grad| {number(norm, 6, 3)}"
                      f"  {metrics[-1]['tokens_per_s']:9,.0f} tok/s  {human_bytes(moved):>10} {work.moved}")
    table = state_table(model, optimizer, grid)  # at rest: before ZeRO-3 gathers the whole model
    grad_sync.finish_param_gather()  # --overlap-param-gather: the last step's parameters, before anything reads them
    say(grid, *work.notes(), f"  tok/s measures how this machine schedules {grid.world.size} processes, not a GPU "
                             "cluster (docs/performance.md)", "", table)
    return metrics, ok, optimizer
