"""The demo with one fault planted, for tests/test_faults.py: ``demo_with_fault.py FAULT RANK STEP [DEMO FLAGS]``.

FAULT is one of
  kill      rank RANK sends itself SIGKILL at the start of step STEP's backward (a crashed node);
  raise     rank RANK raises inside transformer.h.1.mlp's backward at step STEP (a bug on one rank);
  nan       from step STEP on (every rank, RANK ignored), the loss is NaN and transformer.h.1.mlp.c_fc.weight's
            gradient holds a NaN (a diverged step) — ``nan-once`` does it at step STEP only.
The rest of the command line goes to ``python -m tpsim.demo``.
"""

import os
import signal
import sys
import time

import numpy as np

from tpsim.comm.launch import run_main, world_rank
from tpsim.demo import tour
from tpsim.demo.cli import main
from tpsim.tp.mlp import ParallelMLP

fault, fault_rank, fault_step = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
del sys.argv[1:4]
step = {"now": -1}
real_grads, real_backward = tour.pipeline_grads, ParallelMLP.backward


def pipeline_grads(shard, *args, **kwargs):
    step["now"] += 1
    loss, tokens, result = real_grads(shard, *args, **kwargs)
    hit = step["now"] == fault_step or (fault == "nan" and step["now"] > fault_step)
    if fault.startswith("nan") and hit:
        grad = dict(shard.named_grads())["transformer.h.1.mlp.c_fc.weight"]
        grad.flat[0] = np.nan
        loss = float("nan")
    return loss, tokens, result


def say_when(what: str) -> None:
    """The moment of the fault, for the test's "ended within 10 s of it"."""
    print(f"FAULT {what} at {time.time():.3f}", file=sys.stderr, flush=True)


def backward(self, dz, cache):
    if step["now"] == fault_step and world_rank() == fault_rank:
        if fault == "kill":
            say_when("kill")
            os.kill(os.getpid(), signal.SIGKILL)
        if fault == "raise" and getattr(self, "fault_target", False):
            say_when("raise")
            raise RuntimeError(f"injected failure in transformer.h.1.mlp backward on rank {world_rank()}")
    return real_backward(self, dz, cache)


real_build = tour.build


def build(*args, **kwargs):
    shard, grad_sync, executor = real_build(*args, **kwargs)
    for _, module in shard.named_modules():
        if module.path == "transformer.h.1.mlp":
            module.fault_target = True  # only this layer's backward raises
    return shard, grad_sync, executor


tour.pipeline_grads, tour.build, ParallelMLP.backward = pipeline_grads, build, backward
run_main(main, prog="tpsim.demo")
