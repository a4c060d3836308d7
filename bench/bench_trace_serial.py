"""The CPU cost of tracing alone, without MPI's noise (not a test): the demo's model in one process.

    python bench/bench_trace_serial.py

bench_trace.py measures tracing on vs off where it matters, on 8 ranks sharing 2 cores, but there a few
percent drown in the scheduler's noise. Here the serial twin of the demo model (2 layers, hidden 64, 4 heads,
vocab 32, seq 16, batch 8 — one DP replica's rows, float64) runs forward + backward with its tracer on and off,
alternating, and the 10th percentiles are compared: what the layer spans and the ``tpsim.kinds`` marks cost
per step, in microseconds of one core.
"""

from __future__ import annotations

import time

import tpsim  # noqa: F401  - one BLAS thread, set before NumPy loads
import numpy as np

from tpsim.comm.tracer import Tracer
from tpsim.models.build import serial_gpt
from tpsim.arch.gpt2 import GPTConfig
from tpsim.models.gpt import attach_tracer


def main(steps: int = 2000) -> None:
    cfg = GPTConfig(vocab_size=32, n_positions=16, n_embd=64, n_layer=2, n_head=4)
    model = serial_gpt(cfg, seed=1)
    ids = np.random.default_rng(0).integers(0, 32, size=(8, 16))
    tracer = Tracer()
    attach_tracer(model, tracer)
    times: dict[bool, list[float]] = {True: [], False: []}
    for i in range(steps):
        for on in ((True, False) if i % 2 else (False, True)):
            tracer.enabled = on
            t = time.perf_counter()
            model.loss_and_grads(ids, np.roll(ids, -1, axis=1))
            times[on].append(time.perf_counter() - t)
            if on:
                spans, marks = len(tracer.spans), len(tracer.marks)
            tracer.reset()
    off, on = (float(np.percentile(times[k], 10)) for k in (False, True))
    print(f"serial demo model, {steps} steps each way, 10th percentiles: off {off * 1e6:.0f} us, on {on * 1e6:.0f} us")
    print(f"tracing costs {(on - off) * 1e6:.1f} us per step ({on / off - 1:.2%}): {spans} layer spans, {marks} marks")


if __name__ == "__main__":
    main()
