"""Which parameters Hugging Face stores transposed (Llama's ``nn.Linear`` [out, in]), asked of the architecture
once and MPI-free: the export (``tpsim.hf.checkpoint``) and the reader (``tpsim.hf.names``) both use it.
"""

from __future__ import annotations

import numpy as np

from tpsim.arch import architecture_of


def transposed(name: str, config) -> bool:
    """Whether HF stores this 2-D parameter as the transpose of tpsim's layout (``tpsim.arch.*_hf.transposed``)."""
    return architecture_of(config).hf.transposed(name)


def hf_shapes(config) -> dict[str, tuple[int, ...]]:
    """``config.param_shapes()`` in Hugging Face's layout (linears [out, in] for Llama)."""
    return {n: tuple(s[::-1]) if transposed(n, config) else tuple(s) for n, s in config.param_shapes().items()}


def to_hf(tensors: dict[str, np.ndarray], config) -> dict[str, np.ndarray]:
    """tpsim's full tensors -> HF's layout and the files' names (the inverse of ``tpsim.hf.names.to_internal``;
    where an architecture's files spell a name otherwise, as Mixtral's experts, its ``file_names`` says how)."""
    out = {n: np.ascontiguousarray(a.T) if transposed(n, config) else a for n, a in tensors.items()}
    return getattr(architecture_of(config).hf, "file_names", lambda t: t)(out)


def file_shapes(config) -> dict[str, tuple[int, ...]]:
    """``hf_shapes`` under the names the files use (an export's ``.npz``, ``to_hf``'s names)."""
    return getattr(architecture_of(config).hf, "file_names", lambda t: t)(hf_shapes(config))
