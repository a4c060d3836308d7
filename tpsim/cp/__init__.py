"""Context parallelism: the sequence cut over C ranks for every layer, attention included (``--cp``).

    choice     what --cp, --cp-comm and --cp-layout may be, refused in one line before any work (pure)
    layout     which positions a CP rank holds (contiguous, or the load-balanced zigzag) and its causal work (pure)
    blocks     attention one K/V block at a time: partial output and log-sum-exp, the online-softmax merge, and
               each block's share of dQ, dK, dV — the arithmetic every variant runs (pure NumPy)
    ring       K/V around the CP group's ring, forward and the backward ring carrying dK/dV (traced send/recv)
    gathered   K/V all-gathered, their gradients reduce-scattered (Llama 3's choice)
    ulysses    all-to-all from sequence shards to head shards and back (DeepSpeed-Ulysses)
    context    ``ContextParallel``: one layer's attention across the CP group by one of the three, an attention
               core (``tpsim.nn.attention.AttentionCore``), and ``core_for``, the core a model is built with

The model builders hand the core to the attention layers (``tpsim.nn.attention``, ``tpsim.nn.gqa_attention``) and
to the model's body at construction, as a TP layer is handed its ``Region``; the layers call it as they would
the serial core. This package imports nothing from the models, and the pure modules nothing from MPI.
"""
