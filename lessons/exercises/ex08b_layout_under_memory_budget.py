"""Exercise 08b (harder) — choose (tp, dp) under a memory budget (lesson 08_data_times_tensor_parallel.py).

``world`` ranks can be laid out as TP(tp) × DP(dp) for every tp that divides world. A larger tp shrinks the
parameters, gradients and optimizer state each rank holds (÷ tp) but, at a fixed global batch, gives each DP
replica more rows, so activations can grow; the bytes on the wire move from DP's gradient all-reduce to TP's
per-layer all-reduces. Pick the layout a planner would: the fewest bytes sent per rank per step among those
that fit the per-rank memory budget.

Both sides are tpsim's own formulas (pure arithmetic, no MPI):
    tpsim.predict.memory.predict_memory(config, tp, local_batch, seq, dtype) -> {"params": …, "activations": …, …}
        bytes per rank; a layout's memory is the sum of the values; local_batch = batch // dp
    tpsim.predict.formulas.predict_step(run, clip=False) -> [Prediction, …]
        every collective of one training step of ``run = RunConfig.of(config, tp=tp, dp=dp, batch_size=batch,
        seq_len=seq, dtype=dtype)`` (tpsim.config); a layout's communication is the sum of their ``wire_bytes``
    config.check(tp) raises ConfigError when tp is not allowed (heads must divide by tp)

Check it:   tpsim check 08b          (8 ranks like lesson 08; compared with a brute-force search)
Stuck?      tpsim check 08b --hint   (one hint more each time)
The reference answer: tpsim lesson solution 08b (prints where it is) — try first.
"""

from __future__ import annotations

import numpy as np

from tpsim.arch.gpt2 import GPTConfig
from tpsim.config import RunConfig  # noqa: F401  (what predict_step takes)
from tpsim.predict.formulas import predict_step  # noqa: F401  (the formulas you need)
from tpsim.predict.memory import predict_memory  # noqa: F401


def choose_layout(config: GPTConfig, world: int, batch: int, seq: int, dtype: np.dtype,
                  budget_bytes: int) -> tuple[int, int] | None:
    """The ``(tp, dp)`` with ``tp · dp = world`` that sends the fewest wire bytes per rank per step among the
    layouts whose memory per rank is at most ``budget_bytes``; on a tie the smaller tp. ``None`` if none fits.

    ``batch``: the global batch (each DP replica takes ``batch // dp`` rows; dp must divide it); ``seq``: the
    sequence length; ``dtype``: the model's dtype. A layout is allowed only where ``config.check(tp)`` passes.
    """
    # TODO: try every layout; keep those that fit; the cheapest on the wire.
    raise NotImplementedError
