"""What the demo says about context parallelism (``--cp``): the layout line, and which tokens a rank reads.

    context parallel: CP(2) ring, zigzag layout, 8 tokens per CP rank (rank 0: 0-3, 12-15; rank 1: 4-11); ...

The attention work per CP rank (``tpsim.cp.context.ContextParallel.head_pairs``) is gathered after the run and
printed beside the layout's prediction (``tpsim.cp.layout.causal_pairs``): equal under zigzag, the contiguous
layout's ramp otherwise.
"""

from __future__ import annotations

import numpy as np

from tpsim.cp.layout import causal_pairs, positions


def _spans(pos: np.ndarray) -> str:
    """``0-3, 12-15``: runs of consecutive positions."""
    cuts = np.flatnonzero(np.diff(pos) != 1) + 1
    return ", ".join(f"{run[0]}-{run[-1]}" if len(run) > 1 else f"{run[0]}" for run in np.split(pos, cuts))


def cp_lines(grid, run) -> list[str]:
    """The header's CP line (nothing at cp 1)."""
    par, seq = run.parallel, run.schedule.seq_len
    if par.cp == 1:
        return []
    held = "; ".join(f"rank {r}: {_spans(positions(par.cp_layout, r, par.cp, seq))}" for r in range(par.cp))
    return [f"context parallel: CP({par.cp}) {par.cp_comm}, {par.cp_layout} layout, {seq // par.cp} tokens per CP "
            f"rank ({held}); gradients averaged over DP x CP = {par.dp} x {par.cp}"]


def _core(model):
    """The attention core the model was built with (a whole model's body's, or a pipeline chunk's): a
    ``ContextParallel`` under CP, else the serial core (size 1)."""
    return (model.body() if hasattr(model, "body") else model).core


def cp_positions(model, seq_len: int):
    """The positions this rank reads of every sequence (None without CP)."""
    core = _core(model)
    return None if core.size == 1 else core.positions(seq_len // core.size)


def work_lines(grid, model, run) -> list[str]:
    """Attention work per CP rank, measured (gathered, untraced set-up talk) vs the layout's causal pairs."""
    core = _core(model)
    if core.size == 1:
        return []
    with grid.tracer.paused():
        work = core.group.gather_objects(core.head_pairs, root=0)
    if work is None:
        return []
    par, seq = run.parallel, run.schedule.seq_len
    pairs = [causal_pairs(par.cp_layout, r, par.cp, seq) for r in range(par.cp)]
    ratio = max(work) / min(work) if min(work) else float("inf")
    return [f"CP attention work (query-key pairs x heads, every layer and step) per CP rank: {work}; "
            f"max/min {ratio:.3f} (the {par.cp_layout} layout's causal pairs per rank: {pairs})"]
