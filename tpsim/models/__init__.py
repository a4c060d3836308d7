"""Models built from the layers: the GPT (GPT-2 names) serial and tensor-parallel, and the partial-FC classifier.

Import from the modules (``tpsim.models.config``, ``.gpt``, ``.build``, ``.partial_fc``): this package file
imports nothing, so ``tpsim.models.config`` (pure arithmetic) loads without MPI.
"""
