"""The live pipeline: a model cut into stages on real MPI ranks, run by the pure schedules of ``tpsim.pipeline``.

Two packages, two ideas: ``tpsim.pipeline`` is the MPI-free part (the action vocabulary, the schedule
generators, the checker, the cost rule and its clocks, ``tpsim schedule``); this one runs a schedule on ranks.

    split       which layers each (virtual) stage holds: even, or ``--pp-layers a,b,...``   (MPI-free)
    chunk       ``ModelChunk`` (one virtual stage's layers: forward, backward) and ``PipelineShard`` (this rank's
                chunks as one Module, every parameter under its serial name)
    build       the chunks of this rank, cut from the serial master weights (the serial twin is exact)
    executor    runs one rank's action list: F, B, W, SEND_F, RECV_F, SEND_B, RECV_B and the collectives placed
                on them, micro-batch by micro-batch, caches freed as soon as their backward has run
    in_flight   the (micro-batch, chunk) pairs a rank holds between F and the backward that frees them, in bytes
    clock       the live virtual clock (``LiveClock``): the schedule's actions priced by ``tpsim.pipeline.cost_rule``
    step        one training step: micro-batches, the global-batch loss, the tied embedding's gradient over the
                embedding group, the DP sync

This package's ``__init__`` imports nothing, so the configuration can check a split without MPI.
"""
