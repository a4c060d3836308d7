"""The live pipeline: a model cut into stages on real MPI ranks, run by the schedules of ``tpsim.pipeline``.

    tpsim.pp.split      which layers each (virtual) stage holds: even, or ``--pp-layers a,b,...``   (MPI-free)
    tpsim.pp.chunk      ``ModelChunk`` (one virtual stage's layers: forward, backward) and ``PipelineShard``
                        (this rank's chunks as one Module, every parameter under its serial name)
    tpsim.pp.build      the chunks of this rank, cut from the serial master weights (the serial twin is exact)
    tpsim.pp.executor   runs one rank's action list: F, B, SEND_F, RECV_F, SEND_B, RECV_B, micro-batch by
                        micro-batch, caches freed as soon as their backward has run
    tpsim.pp.step       one training step: micro-batches, the global-batch loss, the tied embedding's gradient
                        over the embedding group, the DP sync

This package's ``__init__`` imports nothing, so the configuration can check a split without MPI.
"""
