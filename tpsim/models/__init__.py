"""Models built from the layers: the GPT (GPT-2 names) and the Llama (Hugging Face Llama names), serial and
tensor-parallel, and the partial-FC classifier.

Import from the modules (``.gpt``, ``.build``, ``.llama``, ``.partial_fc``); the configs are data and live in
``tpsim.arch`` (pure arithmetic, no MPI), where the registry says which builder here makes which architecture.
"""
