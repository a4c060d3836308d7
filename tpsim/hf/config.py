"""``config.json`` as Hugging Face writes it -> a tpsim config; every feature tpsim does not model is refused.

The file's ``model_type`` picks the architecture (``tpsim.arch.hf_architecture``), whose reader lists the keys it
reads and refuses (``tpsim.arch.gpt2_hf``, ``tpsim.arch.llama_hf``). Every architecture shares:

    torch_dtype (4.x) or dtype (5.x): the dtype the weights were saved in (informational: tensors are
    converted to the model's dtype when read)

A refused feature raises ``HFConfigError`` (a ``ConfigError``: one line, exit 2 on every rank) naming the key and
its value — a model that would silently compute something else is worse than no model. Dropout probabilities
are training settings and are not read (inference and the step-0 checks run without dropout).
"""

from __future__ import annotations

import json
import os

from tpsim.arch import hf_architecture
from tpsim.arch.hf_keys import HFConfigError


def read_config_json(folder) -> dict:
    """The parsed ``config.json`` of ``folder`` (an ``HFConfigError`` when missing or not JSON)."""
    path = os.path.join(os.fspath(folder), "config.json")
    try:
        with open(path) as f:
            cfg = json.load(f)
    except (OSError, ValueError) as exc:
        raise HFConfigError(f"cannot read {path}: {type(exc).__name__}: {exc}") from exc
    if not isinstance(cfg, dict):
        raise HFConfigError(f"{path} is not a JSON object")
    return cfg


def model_config(cfg: dict, where: str = "config.json"):
    """The tpsim config of a parsed config.json (``GPTConfig`` for gpt2, ``LlamaConfig`` for llama, ...)."""
    return hf_architecture(cfg.get("model_type"), where).hf.read_config(cfg, where)
