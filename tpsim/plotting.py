"""The one way tpsim gets matplotlib: ``pyplot()``, imported on demand, Agg backend, no screen needed.

Import it inside the function that draws, on the rank that draws: importing pyplot on eight ranks costs
seconds at start-up (``../shared/CONVENTIONS.md``). Agg writes PNG files and needs no display, which is what a
headless CI machine and an MPI job have.
"""

from __future__ import annotations


def pyplot():
    """``matplotlib.pyplot`` with the Agg backend selected (safe to call many times)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
