"""Reference answer to exercise 08b — a layout under a memory budget (lesson 08_data_times_tensor_parallel.py)."""

from __future__ import annotations

import numpy as np

from tpsim.arch.gpt2 import GPTConfig
from tpsim.config import RunConfig
from tpsim.errors import ConfigError
from tpsim.predict.formulas import predict_step
from tpsim.predict.memory import predict_memory


def choose_layout(config: GPTConfig, world: int, batch: int, seq: int, dtype: np.dtype,
                  budget_bytes: int) -> tuple[int, int] | None:
    fits = []  # (wire bytes, tp): min() then prefers the fewest bytes, then the smaller tp
    for tp in range(1, world + 1):
        dp = world // tp
        if tp * dp != world or batch % dp:
            continue
        try:
            config.check(tp)  # heads must divide by tp
        except ConfigError:
            continue
        memory = sum(predict_memory(config, tp, batch // dp, seq, dtype).values())
        if memory <= budget_bytes:
            run = RunConfig.of(config, tp=tp, dp=dp, batch_size=batch, seq_len=seq, dtype=dtype)
            wire = sum(row.wire_bytes for row in predict_step(run, clip=False))
            fits.append((wire, tp))
    if not fits:
        return None
    _, tp = min(fits)
    return tp, world // tp
