"""Reading a Hugging Face ``config.json`` the same way for every architecture: a key whose value tpsim does not
model is refused, naming the key and its value — a model that would silently compute something else is worse
than no model. Each architecture's reader (``tpsim.arch.gpt2_hf``, ``tpsim.arch.llama_hf``) lists its keys.
"""

from __future__ import annotations

import json

from tpsim.errors import ConfigError


class HFConfigError(ConfigError):
    """A config.json tpsim cannot read, or one describing a feature tpsim does not model."""


def refuse(where: str, key: str, value, why: str) -> None:
    raise HFConfigError(f"{where}: {key} = {json.dumps(value)} is not supported: {why}")


def require(cfg: dict, where: str, *keys: str) -> None:
    missing = [k for k in keys if k not in cfg]
    if missing:
        raise HFConfigError(f"{where}: config.json lacks {', '.join(missing)}")


def check_flags(cfg: dict, where: str, expected: dict[str, object], why: dict[str, str]) -> None:
    """Refuse a key whose value differs from the one tpsim models (absent keys take HF's default = expected)."""
    for key, want in expected.items():
        if key in cfg and cfg[key] is not None and cfg[key] != want:
            refuse(where, key, cfg[key], why[key])


def first_of(cfg: dict, *names: str, default=None):
    """The value of the first of ``names`` the config has (the spellings a key goes by); ``default`` or a
    ``ConfigError`` when none is there."""
    for n in names:
        if n in cfg:
            return cfg[n]
    if default is None:
        raise ConfigError(f"config.json has none of {', '.join(names)}")
    return default
