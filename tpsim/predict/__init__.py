"""Predictions: what a layout should cost, as pure arithmetic (no MPI, no model built), so a planner runs on a
laptop with nothing but NumPy. Every number here is checked against live runs by ``tpsim.trace``.

    formulas.py      the collectives of one training step (Megatron-LM's volumes), row by row: ``predict_step``
    memory.py        parameters, gradients, optimizer state and cached activations per rank: ``predict_memory``
    gpt_memory.py    what one GPT block holds and caches (LayerNorm, GeLU, dropout; Korthikanti et al.'s Table 2)
    llama_memory.py  the same for the Llama blocks (RMSNorm, SwiGLU, grouped-query attention), both reached
                     through the architecture registry (``tpsim.arch``)
    model_state.py   bytes per parameter under ZeRO-1 (Megatron's distributed-optimizer table)
    hardware.py      alpha-beta link presets for what-if estimates of communication time
    pipeline.py      a pipeline schedule's bubble, micro-batches in flight and p2p bytes (``tpsim.pipeline`` times them)
"""
