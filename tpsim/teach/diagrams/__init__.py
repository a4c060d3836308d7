"""Block diagrams of f and g in the MLP and in attention, drawn by the code (lessons 02, 04 and 05).

    from tpsim.teach.diagrams import f_g_diagram, mlp_diagram, attention_diagram
    fig = mlp_diagram(p=4)               # one lane per tensor-parallel rank; a matplotlib figure (Agg)
    lesson.save(fig, "04_mlp_f_g.png")

    board         the drawing primitives (a figure measured in inches), the colours: f blue, g red
    blocks        the MLP and attention blocks, after Megatron-LM's Fig. 3 (Shoeybi et al. 2019, arXiv:1909.08053)
    conjugate     f and g forward and backward side by side: each one's backward is the other's forward
    legibility    overlapping texts, texts off the canvas, labels too big for their box — measured, not eyeballed

MPI-free: it imports only matplotlib, on demand.
"""

from tpsim.teach.diagrams.blocks import attention_diagram, mlp_diagram
from tpsim.teach.diagrams.conjugate import f_g_diagram

__all__ = ["attention_diagram", "f_g_diagram", "mlp_diagram"]
