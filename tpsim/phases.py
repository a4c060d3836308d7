"""The phase names a trace record carries (``tracer.region(phase=...)``), in one place and MPI-free.

A phase says *why* bytes moved; the scope says *which layer* moved them. The operators f, g, f̄, ḡ tag their
own collectives ``FORWARD``/``BACKWARD``; everything else is tagged by its caller.
"""

from __future__ import annotations

FORWARD = "forward"            # an operator's forward collective (g, gather, f̄, ḡ, the vocab-parallel CE)
BACKWARD = "backward"          # an operator's backward collective (f, scatter, f̄, ḡ)
DP_SYNC = "dp_sync"            # data-parallel gradient all-reduce (DDP buckets, the loss normaliser)
SP_GRAD_SYNC = "sp_grad_sync"  # sequence parallelism: all-reduce of a replicated LayerNorm's gradients
OPTIMIZER = "optimizer"        # collectives of the optimizer step (the TP-aware gradient-norm all-reduce)
INIT = "init"                  # start-up: the parameter broadcasts over DP (the SenseParrots article §3.1)
DATA = "data"                  # the batch broadcast inside a TP group
EXPORT = "export"              # gathering full tensors for a file
VERIFY = "verify"              # checks of the run itself (replica consistency, serial comparison)
TRACE = "trace"                # gathering the trace records themselves

# Phases of one training step, in the order they happen (the formulas predict exactly these).
TRAINING = (DATA, FORWARD, BACKWARD, SP_GRAD_SYNC, DP_SYNC, OPTIMIZER)
# Phases whose records belong to a layer's forward or backward pass (a step "has trained" when it has them).
PASSES = (FORWARD, BACKWARD)
ALL = (FORWARD, BACKWARD, DP_SYNC, SP_GRAD_SYNC, OPTIMIZER, INIT, DATA, EXPORT, VERIFY, TRACE)
