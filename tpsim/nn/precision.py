"""16-bit mixed precision: where tpsim rounds, and what it computes in float32 — one policy for every layer.

NumPy has no fast bfloat16 (or float16) matmul, so tpsim emulates what a GPU's tensor cores do:

    16-bit operands  ->  cast up to float32  ->  multiply and accumulate in float32  ->  round to 16 bits

Rounding is NumPy's / ``ml_dtypes``' cast: round-to-nearest-even, the hardware default. The policy, Megatron-LM's
with ``--bf16`` / ``--fp16`` (Micikevicius et al. 2017, arXiv:1710.03740):

    parameters, activations, TP collectives   16-bit (``bfloat16`` from ml_dtypes, or ``float16``)
    matmuls (``matmul``)                      float32 accumulation, the result rounded to the operands' dtype
    weight gradients (``wgrad``)              float32, added straight into the float32 main gradient
                                              (Megatron's gradient_accumulation_fusion)
    LayerNorm, softmax, GeLU, cross-entropy   computed in float32 inside (``fp32_inside``; fused kernels do
                                              the same), the activation they return rounded to 16 bits
    gradients of the parameters               float32 ``main_grad`` (``grad_dtype``), reduced over DP in float32

A float32 or float64 model never takes a 16-bit branch: each helper checks the dtype once and calls the
same NumPy expression as before, so those paths cost what they did (no extra casts).
"""

from __future__ import annotations

import functools

import numpy as np

try:  # a base dependency (pyproject.toml); the import is guarded so float32/float64 work without it
    import ml_dtypes
    bfloat16 = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover - ml_dtypes is installed with tpsim
    bfloat16 = None

FP32 = np.dtype(np.float32)
HALF_DTYPES = frozenset(d for d in (bfloat16, np.dtype(np.float16)) if d is not None)
DTYPE_NAMES = ("float64", "float32", "bfloat16", "float16")  # what --dtype accepts


def dtype_of(name) -> np.dtype:
    """``np.dtype`` for a name in ``DTYPE_NAMES`` (NumPy does not know "bfloat16" without ml_dtypes)."""
    if isinstance(name, str) and name == "bfloat16":
        if bfloat16 is None:  # pragma: no cover
            raise ImportError("bfloat16 needs the ml_dtypes package (pip install ml_dtypes)")
        return bfloat16
    return np.dtype(name)


def is_half(dtype) -> bool:
    """True for bfloat16 and float16, the dtypes that take the mixed-precision branches."""
    return np.dtype(dtype) in HALF_DTYPES


def grad_dtype(dtype) -> np.dtype:
    """The dtype of a parameter's gradient: float32 ``main_grad`` for 16-bit parameters, else the parameter's."""
    dtype = np.dtype(dtype)
    return FP32 if dtype in HALF_DTYPES else dtype


def accum_itemsize(dtype) -> int:
    """Bytes per element of what a model in ``dtype`` accumulates and reduces in float32 under mixed precision
    (main gradients, the cross-entropy's sums): 4 for 16-bit models, the itemsize otherwise."""
    return grad_dtype(dtype).itemsize


def _half(a: np.ndarray, b: np.ndarray) -> np.dtype | None:
    if a.dtype in HALF_DTYPES:
        return a.dtype
    return b.dtype if b.dtype in HALF_DTYPES else None


def _up(x: np.ndarray, half: np.dtype) -> np.ndarray:
    """``x`` as a 16-bit operand, cast up to float32 (a float32 ``x`` is first rounded to ``half``)."""
    return (x if x.dtype == half else x.astype(half)).astype(FP32)


def matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a @ b``; with a 16-bit operand: both rounded to it, float32 multiply-accumulate, result rounded back."""
    half = _half(a, b)
    if half is None:
        return a @ b
    return (_up(a, half) @ _up(b, half)).astype(half)


def wgrad(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """A weight gradient ``a @ b``: like ``matmul``, but a 16-bit product stays float32 (it is added into the
    float32 main gradient, as Megatron's fused wgrad GEMM accumulates into ``main_grad``)."""
    half = _half(a, b)
    if half is None:
        return a @ b
    return _up(a, half) @ _up(b, half)


def row_sum(x: np.ndarray) -> np.ndarray:
    """``x.sum(axis=0)`` (a bias gradient), accumulated in float32 when ``x`` is 16-bit."""
    return x.sum(axis=0, dtype=FP32) if x.dtype in HALF_DTYPES else x.sum(axis=0)


def _cast_up(args: tuple) -> tuple:
    return tuple(a.astype(FP32) if getattr(a, "dtype", None) in HALF_DTYPES else a for a in args)


def fp32_inside(fn):
    """Decorator for a pure function whose first argument is an activation (or its gradient): given a 16-bit
    one, every 16-bit array argument is cast up to float32, ``fn`` runs in float32, and its activation result
    — the return value, or the first item of a returned tuple ``(out, cache)`` / ``(dx, dw, db)`` — is rounded
    back; caches and parameter gradients stay float32. Other dtypes call ``fn`` unchanged."""
    @functools.wraps(fn)
    def wrapper(x, *args, **kwargs):
        half = getattr(x, "dtype", None)
        if half not in HALF_DTYPES:
            return fn(x, *args, **kwargs)
        out = fn(x.astype(FP32), *_cast_up(args), **kwargs)
        if isinstance(out, tuple):
            first = out[0].astype(half) if isinstance(out[0], np.ndarray) else out[0]
            return (first,) + out[1:]
        return out.astype(half)
    return wrapper


def fp32_weight_grads(fn):
    """``fp32_inside`` for a function that returns parameter gradients only (a norm's weight-gradient half):
    16-bit arguments cast up to float32 alike, and nothing rounded back — they stay float32, the main gradient."""
    @functools.wraps(fn)
    def wrapper(dy, *args, **kwargs):
        if getattr(dy, "dtype", None) not in HALF_DTYPES:
            return fn(dy, *args, **kwargs)
        return fn(dy.astype(FP32), *_cast_up(args), **kwargs)
    return wrapper
