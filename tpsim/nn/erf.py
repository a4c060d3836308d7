"""A vectorised error function, ``erf`` and ``erfc``, within a few ulp of libm, for the exact (erf) GeLU.

NumPy has no ``erf``; ``math.erf`` one element at a time (``np.vectorize``) costs ~0.1 µs an element in Python.
Here the half line is cut in three and each piece is a short polynomial (Horner, in place) times ``exp``:

    0   ≤ z < 0.5:  erf(z)  = z · P1(z²)
    0.5 ≤ z < 3:    erfc(z) = exp(−z²) · P2_i(z − c_i)      five pieces of width 0.5, c_i the middle of each
    3   ≤ z:        erfc(z) = exp(−z²) / z · P3(1 / z²)

with ``erf(−z) = −erf(z)``, ``erfc(−z) = 2 − erfc(z)``. The coefficients are Chebyshev least-squares fits to
50-digit values, made by ``bench/fit_erf.py`` (the method is the textbook one of W. J. Cody, Math. Comp. 23,
1969, with plain polynomials fitted by us). ``exp(−z²)`` is taken as ``exp(−h²) · exp(−(z − h)(z + h))`` with
``h`` = z rounded to 1/16, so the rounding of z² (which grows with z²) does not reach the tail. Measured
against ``math.erf``/``math.erfc`` on a dense grid (tests/test_nn_activations.py): erf within 3 ulp, erfc within
8 ulp of its own (tiny) value, which is what keeps the GeLU's left tail ``Φ(x) = erfc(−x/√2) / 2`` accurate.
Computed in float64; the result is cast to ``x``'s floating dtype.
"""

from __future__ import annotations

import numpy as np

_COEF = {  # made by bench/fit_erf.py
    'P1': (1.1283791670955123, -0.3761263890317873, 0.11283791670445849, -0.026866170424350987,
        0.005223972521153178, -0.0008547626629457393, 0.00011995505489421057, -1.1714446047083695e-05,
        -8.878461973811844e-06, 1.907424453642862e-05, -1.5010787192013443e-05),
    'P2_0': (0.5069376502931449, -0.3679726916557962, 0.2309581315512922, -0.12983606199467979,
        0.06679054253114204, -0.031897262061380355, 0.014289198328403143, -0.0060515310971947225,
        0.0024376502183263062, -0.0009385448845804872, 0.0003465221033349497, -0.00012292548269285307,
        4.417947594013047e-05, -1.632516724319533e-05),
    'P2_1': (0.3678229164523611, -0.2088218759646115, 0.1067955714965999, -0.05021827439544906,
        0.022011364252278086, -0.009081627680311358, 0.003553109747041528, -0.0013257806113559257,
        0.00047397638742821194, -0.00016301713081856307, 5.395167964032884e-05, -1.6659339153823157e-05,
        6.0554880149599685e-06, -4.816111654972657e-06),
    'P2_2': (0.2849722347374363, -0.13097634551448603, 0.05576363008710309, -0.022259995241136008,
        0.008404319205369016, -0.003020974679656255, 0.0010392046300665102, -0.0003435318813219078,
        0.00010950224915674683, -3.379368155681454e-05, 1.0129349560235639e-05, -2.4440022056948136e-06,
        5.970199451368983e-07, -2.592489661998527e-06),
    'P2_3': (0.23108725873039182, -0.08848650280874933, 0.031992627410705424, -0.01100206075636788,
        0.0036189953545195178, -0.0011437284924672331, 0.00034853541727278465, -0.00010272064874940487,
        2.9353216885456702e-05, -8.160257349964164e-06, 2.2055089491106387e-06, -4.723388191807216e-07,
        1.2793284538647822e-07, -4.839291003488394e-07),
    'P2_4': (0.19366209627906864, -0.06323763756063518, 0.01975859298731658, -0.005934337896895076,
        0.00171958188645601, -0.0004821950961499194, 0.00013118172299080938, -3.4698056123509776e-05,
        8.942514221476117e-06, -2.2610812517074564e-06, 5.183945505764589e-07, 3.317538839402681e-08,
        2.1322140897746368e-07, -7.884862939098393e-07),
    'P3': (0.5641895835477565, -0.28209479177429453, 0.4231421878267988, -1.057855496253705, 3.702495842218912,
        -16.661164206109767, 91.61814739894221, -594.047680589901, 4384.89093774442, -34983.40361897574,
        279434.71099167364, -2044469.2388504527, 12585948.325256001, -60254265.4661309, 205727901.04172698,
        -440225131.04564756, 440507483.8605183),
}
_SMALL, _MIDDLE, _WIDTH, _UNDERFLOW = 0.5, 3.0, 0.5, 40.0
_PIECES = [(lo, lo + _WIDTH / 2, _COEF[f"P2_{i}"]) for i, lo in enumerate(np.arange(_SMALL, _MIDDLE, _WIDTH))]


def _horner(coef: tuple, v: np.ndarray) -> np.ndarray:
    out = np.full_like(v, coef[-1])
    for c in coef[-2::-1]:
        out *= v
        out += c
    return out


def _exp_minus_square(z: np.ndarray) -> np.ndarray:
    """``exp(−z²)`` with z = h + (z − h), h a multiple of 1/16: h² is exact, (z − h)(z + h) is small."""
    h = np.round(z * 16.0) / 16.0
    out = np.exp(-(h * h))
    out *= np.exp(-((z - h) * (z + h)))
    return out


def _erfc_positive(z: np.ndarray) -> np.ndarray:
    """``erfc(z)`` for ``z ≥ 0.5`` (float64): the piece's polynomial times ``exp(−z²)``; NaN stays NaN."""
    z = np.minimum(z, _UNDERFLOW)  # erfc is 0 in float64 from z ≈ 27.3 on; this keeps inf out of the arithmetic
    out = np.full_like(z, np.nan)
    for lo, centre, coef in _PIECES:
        at = (z >= lo) & (z < lo + _WIDTH)
        out[at] = _horner(coef, z[at] - centre)
    tail = z >= _MIDDLE
    zt = z[tail]
    out[tail] = _horner(_COEF["P3"], 1.0 / (zt * zt)) / zt
    out *= _exp_minus_square(z)
    return out


def _split(x) -> tuple[np.ndarray, np.ndarray, np.dtype]:
    x = np.asarray(x)
    dtype = x.dtype if x.dtype.kind == "f" else np.dtype(np.float64)
    return x.astype(np.float64, copy=False), np.abs(x) < _SMALL, dtype


def erf(x) -> np.ndarray:
    """Elementwise error function of ``x: [...]`` in ``x``'s floating dtype (float64 for ints)."""
    x, small, dtype = _split(x)
    out = np.empty_like(x)
    xs = x[small]
    out[small] = xs * _horner(_COEF["P1"], xs * xs)
    big = ~small
    xb = x[big]
    out[big] = np.copysign(1.0 - _erfc_positive(np.abs(xb)), xb)
    return out.astype(dtype, copy=False)


def erfc(x) -> np.ndarray:
    """Elementwise ``1 − erf(x)`` of ``x: [...]``, accurate in both tails (no cancellation), dtype as ``erf``."""
    x, small, dtype = _split(x)
    out = np.empty_like(x)
    xs = x[small]
    out[small] = 1.0 - xs * _horner(_COEF["P1"], xs * xs)
    big = ~small
    xb = x[big]
    tail = _erfc_positive(np.abs(xb))
    out[big] = np.where(xb > 0, tail, 2.0 - tail)
    return out.astype(dtype, copy=False)
