"""Hugging Face parameter names and layouts <-> tpsim's (``config.param_shapes()`` gives tpsim's side).

Each architecture says how its files spell names in the wild and which weights they store transposed
(``tpsim.arch.gpt2_hf``: GPT-2 with or without ``transformer.``, mask buffers and a tied ``lm_head`` copy dropped,
nothing transposed; ``tpsim.arch.llama_hf``: HF's names, every ``*_proj.weight`` transposed). This module applies
it and checks the result against the model.
"""

from __future__ import annotations

import numpy as np

from tpsim.arch import architecture_of
from tpsim.hf.layout import hf_shapes, transposed
from tpsim.hf.checkpoint import check_tensors


def to_internal(tensors: dict[str, np.ndarray], config, label: str = "checkpoint") -> dict[str, np.ndarray]:
    """HF-named, HF-layout tensors -> tpsim's names and layout, checked against ``config.param_shapes()``.

    Anything missing, extra (a bias tpsim's Llama has none of, say), misshapen or not floating-point is refused
    with a ``CheckpointError`` naming it.
    """
    tensors = architecture_of(config).hf.canonical_names(tensors)
    check_tensors(tensors, hf_shapes(config), label)
    return {n: np.ascontiguousarray(tensors[n].T) if transposed(n, config) else tensors[n]
            for n in config.param_shapes()}
