"""16-bit arrays on the wire: what MPI is handed for bfloat16 and float16, so each element really travels as 2 bytes.

MPI has no bfloat16 datatype and no bfloat16 sum. tpsim sends a bfloat16 array as its 2-byte bit pattern
(``MPI.UINT16_T``, a ``uint16`` view — no copy) and reduces it with a user-defined ``MPI.Op`` that does what a
GPU's reduction kernel (NCCL's) does at each step of the algorithm: cast both operands up to float32, add
(or max / min), round the result to bfloat16 (nearest-even). So an all-reduce over p ranks rounds up to
log2(p) (recursive doubling) or p − 1 (ring) times, each with relative error ≤ 2^-8 (bfloat16's unit
roundoff) — tests/mpi/test_half_collectives.py bounds the result against a float64 sum.

float16 is different: MPICH 4 has ``MPIX_C_FLOAT16`` with a native SUM (mpi4py maps NumPy's ``float16`` to
it). Whether this MPI has it is *checked* once, on ``COMM_SELF``, not assumed: when the native call fails,
float16 takes the same user-defined path as bfloat16.

    wire_buffer(x)            the object to pass as an MPI buffer (a uint16 view for bfloat16, else x)
    reduce_op(name, dtype)    MPI.SUM / MAX / MIN, or the 16-bit user op where MPI has none
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from tpsim.nn.precision import FP32, HALF_DTYPES, bfloat16

NATIVE_OPS = {"sum": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN}
_UFUNCS = {"sum": np.add, "max": np.maximum, "min": np.minimum}
_user_ops: dict[tuple[str, np.dtype], MPI.Op] = {}
_native: dict[np.dtype, bool] = {}


def wire_buffer(x: np.ndarray):
    """``x`` as MPI should see it: bfloat16 as ``[uint16 view, MPI.UINT16_T]`` (2 bytes, no copy), else ``x``."""
    if x.dtype == bfloat16:
        return [x.view(np.uint16), MPI.UINT16_T]
    return x


def _make_op(name: str, dtype: np.dtype) -> MPI.Op:
    ufunc = _UFUNCS[name]

    def combine(inbuf, inoutbuf, datatype) -> None:  # inoutbuf <- round(float32(in) ∘ float32(inout))
        a = np.frombuffer(inbuf, dtype=dtype)
        b = np.frombuffer(inoutbuf, dtype=dtype)
        b[...] = ufunc(a.astype(FP32), b.astype(FP32)).astype(dtype)

    return MPI.Op.Create(combine, commute=True)


def native_half(dtype: np.dtype) -> bool:
    """Does this MPI reduce ``dtype`` itself? bfloat16: never; float16: one probe on COMM_SELF, cached."""
    dtype = np.dtype(dtype)
    if dtype not in _native:
        ok = False
        if dtype == np.float16:
            try:
                x, out = np.ones(2, np.float16), np.zeros(2, np.float16)
                MPI.COMM_SELF.Allreduce(x, out, op=MPI.SUM)
                ok = bool(np.all(out == 1))
            except Exception:  # no MPIX_C_FLOAT16 (or no SUM for it) in this MPI
                ok = False
        _native[dtype] = ok
    return _native[dtype]


def reduce_op(name: str, dtype: np.dtype) -> MPI.Op:
    """The ``MPI.Op`` for reduction ``name`` on arrays of ``dtype``."""
    if dtype not in HALF_DTYPES or native_half(dtype):
        return NATIVE_OPS[name]
    key = (name, np.dtype(dtype))
    if key not in _user_ops:
        _user_ops[key] = _make_op(name, np.dtype(dtype))
    return _user_ops[key]
