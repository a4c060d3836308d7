"""Hugging Face model folders in and out — MPI-free, NumPy only (plus ``safetensors`` to read the weights).

    config.py   config.json (GPT-2 or Llama, transformers 4.x and 5.x spellings) -> a tpsim config, or one
                line naming the feature tpsim does not model (each architecture's keys: tpsim.arch.*_hf)
    weights.py  model.safetensors / model.safetensors.index.json / params.npz -> NumPy arrays by HF name
                (float32, float16, bfloat16; bfloat16 via ml_dtypes), and model.safetensors out
    names.py    HF names and layouts <-> tpsim's parameter names and layouts
    folder.py   a whole folder -> (config, full tensors in tpsim's layout); what ``--init-from`` calls

The tensors returned are the serial model's *full* master tensors; every rank reads the folder and keeps its
own shard (``tpsim.hf.checkpoint.load_into``), so a checkpoint loads at any TP size.
"""
