"""Hints one level at a time: ``tpsim check NN FILE --hint`` shows the next one, ``--hint N`` level N.

Every exercise function has a few hints, from a nudge to the last level, which comes close to the answer. A
failure message never prints a hint; it says how many there are. ``--hint`` with no number reveals one more
level for the function the check stopped at and remembers it in a small JSON file, ``tpsim-out/hints.json`` of
the working directory (``{"02": {"g_backward": 2}}``): delete it to start over. ``--hint N`` shows levels
1 … N and stores N. Pure file handling and text: no MPI.
"""

from __future__ import annotations

import json
from pathlib import Path

from tpsim.atomic import write_text

HINT_STATE = Path("tpsim-out") / "hints.json"
NEXT = -1  # ``--hint`` without a number: one level more than last time


def read_state(path: Path) -> dict[str, dict[str, int]]:
    """The stored levels; an absent or unreadable file is an empty state (a hint is never worth a crash)."""
    try:
        state = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return state if isinstance(state, dict) else {}


def write_state(path: Path, state: dict[str, dict[str, int]]) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text(path, json.dumps(state, indent=1, sort_keys=True) + "\n")


def reveal(number: str, function: str, levels: tuple[str, ...], request: int, state_path: Path) -> list[str]:
    """The hint lines for ``function`` of exercise ``number`` at the requested level (``NEXT`` or 1, 2, …)."""
    if not levels:
        return [f"  no hints for {function}"]
    state = read_state(state_path)
    stored = state.get(number, {}).get(function, 0) if isinstance(state.get(number), dict) else 0
    level = stored + 1 if request == NEXT else request
    level = max(1, min(level, len(levels)))
    state.setdefault(number, {})
    if not isinstance(state[number], dict):
        state[number] = {}
    state[number][function] = level
    write_state(state_path, state)
    lines = [f"  hint {i + 1} of {len(levels)} for {function}: {text}" for i, text in enumerate(levels[:level])]
    if level < len(levels):
        lines.append(f"  (--hint again for the next level; level {level} is remembered in {state_path})")
    else:
        lines.append("  (that was the last level)")
    return lines


def offer(number: str, function: str, levels: tuple[str, ...], path: Path) -> str:
    """The line a failure message ends with: how to ask for a hint, never the hint itself."""
    if not levels:
        return ""
    return (f"  stuck? tpsim check {number} {path} --hint reveals {function}'s {len(levels)} hints one level "
            f"at a time")
