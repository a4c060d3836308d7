"""Keep freed activation memory in the process instead of handing it back to the kernel every step.

A training step allocates and frees the same large arrays every time (activations, their gradients, the
partial sums an all-reduce adds up: 8 MiB each for a [2048, 1024] float32 tensor). glibc's ``malloc`` serves
a request that large with ``mmap`` or from the top of its heap, and gives the memory back (``munmap``, or a
trim of the heap once more than twice its moving threshold lies free at the top) as soon as it is freed. The
next step then touches fresh pages: one minor page fault per 4 KiB, ~2 ms of kernel time per 8 MiB array.
Measured on the 2-core development machine, one rank's share of the TP-4 MLP (h 1024, 2048 tokens, float32,
forward + backward): 225–230 ms per step by default, 216–221 ms with the settings below, its six GEMMs alone
208–214 ms — the page faults were half of everything that was not a GEMM.

``keep_freed_memory`` sets two of glibc's documented ``mallopt`` parameters (``man 3 mallopt``), which is what
the ``MALLOC_MMAP_THRESHOLD_``/``MALLOC_TRIM_THRESHOLD_`` environment variables would do had they been set
before Python started:

- ``M_MMAP_THRESHOLD`` = 32 MiB (glibc's largest allowed value): arrays up to that size come from the heap,
  where a freed block is reused by the next request, instead of a fresh ``mmap`` each time;
- ``M_TRIM_THRESHOLD`` = 1 GiB: the free top of the heap stays mapped up to that size.

The price: a rank's resident memory stays at its peak instead of shrinking between steps — what it needs
each step anyway. ``TPSIM_MALLOC=default`` leaves glibc as it is; on a C library other than glibc (macOS)
there is no ``mallopt`` and nothing changes. ``import tpsim`` applies it (it must not fail an import: an unknown
``TPSIM_MALLOC`` changes nothing there, and ``check_mode`` — run by every entry point before any work — turns it
into one line and exit status 2).
"""

from __future__ import annotations

import ctypes
import os

from tpsim.errors import ConfigError

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's malloc.h
MMAP_THRESHOLD = 32 << 20  # glibc refuses more than HEAP_MAX_SIZE / 2 = 32 MiB on 64-bit
TRIM_THRESHOLD = 1 << 30
MODES = ("keep", "default")


def check_mode(environ=os.environ) -> str:
    """``TPSIM_MALLOC`` (default ``keep``), or a ConfigError naming the allowed values."""
    mode = environ.get("TPSIM_MALLOC", "keep")
    if mode not in MODES:
        raise ConfigError(f"TPSIM_MALLOC must be keep or default, got {mode!r}")
    return mode


def keep_freed_memory(environ=os.environ) -> bool:
    """Apply the two settings when ``TPSIM_MALLOC`` is ``keep`` (the default); True when glibc accepted both."""
    if environ.get("TPSIM_MALLOC", "keep") != "keep":
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the C library the interpreter runs on
    except (OSError, AttributeError):  # no mallopt (not glibc): nothing to tune
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) & bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
