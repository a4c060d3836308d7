"""Hugging Face parameter names and layouts <-> tpsim's (``config.param_shapes()`` gives tpsim's side).

GPT-2: tpsim already uses HF's names and GPT-2's ``Conv1D`` layout [in, out], so only the spelling varies in the
wild — with ``transformer.`` (``GPT2LMHeadModel``) or without it (``GPT2Model``, the hub's ``gpt2``) — plus
two things that are not parameters: the causal-mask buffers ``h.{i}.attn.bias`` / ``attn.masked_bias`` some
files carry (dropped), and ``lm_head.weight``, which a tied GPT-2 may store as a copy of ``wte`` (dropped when it
equals wte, refused when it does not: that model is untied).

Llama: HF's names too, but ``nn.Linear`` stores ``[out, in]`` and tpsim's linears hold ``[in, out]``, so every
``*_proj.weight`` is transposed on the way in and back on the way out. The embedding and ``lm_head`` are
``[vocab, hidden]`` on both sides.
"""

from __future__ import annotations

import numpy as np

from tpsim.hf.layout import hf_shapes, is_llama, transposed
from tpsim.hf.checkpoint import CheckpointError, check_tensors

GPT2_PREFIX = "transformer."
GPT2_BUFFERS = (".attn.bias", ".attn.masked_bias")  # causal-mask buffers, not parameters


def _gpt2_names(tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """GPT-2 tensors under ``GPT2LMHeadModel``'s names, buffers and a tied ``lm_head.weight`` dropped."""
    out = {}
    for name, a in tensors.items():
        if name.endswith(GPT2_BUFFERS) and (a.ndim != 1 or name.endswith("masked_bias")):
            continue  # the [1, 1, n, n] causal mask, not c_attn's bias (which is 1-D)
        out[name if name.startswith(GPT2_PREFIX) or name == "lm_head.weight" else GPT2_PREFIX + name] = a
    head = out.pop("lm_head.weight", None)
    wte = out.get(GPT2_PREFIX + "wte.weight")
    if head is not None and (wte is None or head.shape != wte.shape or not np.array_equal(head, wte)):
        raise CheckpointError("lm_head.weight differs from transformer.wte.weight: an untied GPT-2 "
                              "(tpsim's GPT-2 ties the LM head to the token embedding)")
    return out


def to_internal(tensors: dict[str, np.ndarray], config, label: str = "checkpoint") -> dict[str, np.ndarray]:
    """HF-named, HF-layout tensors -> tpsim's names and layout, checked against ``config.param_shapes()``.

    Anything missing, extra (a bias tpsim's Llama has none of, say), misshapen or not floating-point is refused
    with a ``CheckpointError`` naming it.
    """
    if not is_llama(config):
        tensors = _gpt2_names(tensors)
    check_tensors(tensors, hf_shapes(config), label)
    return {n: np.ascontiguousarray(tensors[n].T) if transposed(n, config) else tensors[n]
            for n in config.param_shapes()}
