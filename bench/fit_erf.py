"""Regenerate the coefficients of ``tpsim/nn/erf.py``: Chebyshev least-squares fits to 50-digit values.

    python bench/fit_erf.py          # needs mpmath (only here; tpsim itself does not import it)

Method (ours, textbook): split the half line in three, fit a smooth function that is close to constant in each,
and let ``exp`` carry the Gaussian decay, as in Cody's classic rational approximations (W. J. Cody, "Rational
Chebyshev approximations for the error function", Math. Comp. 23, 1969) — but with plain polynomials fitted here:
    0   ≤ z < 0.5:  erf(z)  = z · P1(z²)                  P1 ≈ erf(z)/z, Taylor-like, alternating
    0.5 ≤ z < 3:    erfc(z) = exp(−z²) · P2_i(z − c_i)     Q = erfc · exp(z²), smooth, slowly falling, on five
                                                           pieces [a, b) of width 0.5, each centred at c = (a+b)/2
    3   ≤ z:        erfc(z) = exp(−z²) / z · P3(1 / z²)    z · Q → 1/√π as z → ∞, a polynomial in 1/z²
Each fit samples 4000 Chebyshev points of its interval with targets computed by mpmath at 50 digits, and is
converted to the power basis of the variable it is evaluated in (Horner on t = z², z − c, 1/z²).
"""

import mpmath
import numpy as np
from numpy.polynomial import Chebyshev, Polynomial

mpmath.mp.dps = 50
SMALL, PIECES = 0.5, (0.5, 1.0, 1.5, 2.0, 2.5, 3.0)  # erfc · exp(z²) on each [a, b), centred at (a + b) / 2
Q = lambda z: mpmath.erfc(z) * mpmath.exp(z * z)
REGIONS = {  # name: (variable lo, hi, degree, target as a function of the variable)
    "P1": (0.0, SMALL**2, 10,
           lambda t: mpmath.erf(mpmath.sqrt(t)) / mpmath.sqrt(t) if t > 0 else 2 / mpmath.sqrt(mpmath.pi)),
    **{f"P2_{i}": (-(b - a) / 2, (b - a) / 2, 13, lambda s, c=(a + b) / 2: Q(s + c))
       for i, (a, b) in enumerate(zip(PIECES, PIECES[1:]))},
    "P3": (0.0, 1 / 9, 16, lambda w: Q(1 / mpmath.sqrt(w)) / mpmath.sqrt(w) if w > 0 else 1 / mpmath.sqrt(mpmath.pi)),
}


def fit(lo: float, hi: float, degree: int, target, n: int = 4000) -> np.ndarray:
    v = (lo + hi) / 2 + (hi - lo) / 2 * np.cos(np.linspace(0, np.pi, n))
    y = np.array([float(target(mpmath.mpf(float(x)))) for x in v])
    return Chebyshev.fit(v, y, degree, domain=[lo, hi]).convert(kind=Polynomial).coef


if __name__ == "__main__":
    for name, (lo, hi, degree, target) in REGIONS.items():
        print(f"    {name!r}: (" + ", ".join(repr(float(c)) for c in fit(lo, hi, degree, target)) + "),")
