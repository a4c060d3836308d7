"""Models built from the layers: the GPT (GPT-2 names) and the Llama (Hugging Face Llama names), serial and
tensor-parallel, and the partial-FC classifier.

Import from the modules (``tpsim.models.config``, ``.gpt``, ``.build``, ``.llama_config``, ``.llama``,
``.partial_fc``): this package file imports nothing, so the configs (pure arithmetic) load without MPI.
"""
