"""tpsim — a multi-process CPU simulator and teaching toolkit for Megatron-style tensor parallelism.

Real MPI processes stand in for GPUs, NumPy does the math, every backward is written by hand and every
collective is traced. Layers: ``tpsim.comm`` (grid, traced collectives) → ``tpsim.tp`` (f, g, parallel
layers) → ``tpsim.nn`` (serial layers) → models → training, demo, lessons.
"""

import os as _os

# One BLAS thread per rank: eight ranks on a few cores each spawning a BLAS thread pool run ~5x slower.
# setdefault, so a user who exports OPENBLAS_NUM_THREADS (etc.) keeps their choice. This must run before
# NumPy is first imported, which is why it sits at the very top of the package.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    _os.environ.setdefault(_var, "1")

# Freed activation memory stays in the process for the next step instead of page-faulting back in every step
# (glibc's mallopt; tpsim/allocator.py says what and how much it saves, TPSIM_MALLOC=default to leave it).
from tpsim.allocator import keep_freed_memory as _keep_freed_memory  # noqa: E402  (after the BLAS variables)

_keep_freed_memory()

__version__ = "0.1.0"
