"""Ranks on a grid named by an order string: any parallel axis is one letter group, any group a product of axes.

Megatron-LM lays its ranks out by an order string (``RankGenerator``, order ``"tp-cp-ep-dp-pp"``): the first axis
varies fastest, so with sizes s_1, s_2, ... a rank's coordinates are its digits in that mixed radix,

    rank = c_1 + s_1·(c_2 + s_2·(c_3 + ...))          order "tp-cp-dp-pp": rank = tp + t·(cp + c·(dp + d·pp))

and a group over some axes (a *product*: ``("dp", "cp")`` is DP × CP) holds the ranks that agree on every other
axis, listed by their coordinates on its own axes, the earliest axis of the order fastest:

    order "tp-cp-dp-pp", tp 2, cp 2, dp 2:  group("tp") of rank 0 = (0, 1),  group("dp", "cp") of rank 0 =
    (0, 2, 4, 6) — cp_rank + cp·dp_rank, the rows of ``tpsim.comm.grid``'s cube

The axes a group names may come in any order; the order string fixes the members' order. A new axis (experts'
``ep``, an expert sub-grid) is one more name in the order string. Pure arithmetic, no MPI: the process grid
(``tpsim.comm.grid``) splits its communicators by ``color`` (which group) and ``key`` (place in it).
"""

from __future__ import annotations

from itertools import product
from math import prod
from typing import Mapping

from tpsim.errors import ConfigError


class RankGrid:
    """The ranks of ``order`` (axis names joined by "-", fastest first) with ``sizes[axis]`` each."""

    def __init__(self, order: str, sizes: Mapping[str, int]) -> None:
        axes = tuple(order.split("-"))
        if len(set(axes)) != len(axes) or not all(axes):
            raise ConfigError(f"order {order!r}: each axis once, names joined by '-'")
        missing, extra = [a for a in axes if a not in sizes], [a for a in sizes if a not in axes]
        if missing or extra:
            raise ConfigError(f"order {order!r} and sizes {dict(sizes)}: "
                              + (f"no size for {missing}" if missing else f"{extra} not in the order"))
        bad = {a: sizes[a] for a in axes if not isinstance(sizes[a], int) or sizes[a] < 1}
        if bad:
            raise ConfigError(f"every axis size must be a whole number >= 1: {bad}")
        self.order, self.axes = order, axes
        self.sizes = {a: int(sizes[a]) for a in axes}
        self.world = prod(self.sizes.values())
        self.strides, step = {}, 1
        for a in axes:
            self.strides[a] = step
            step *= self.sizes[a]

    def coords(self, rank: int) -> dict[str, int]:
        """``rank``'s coordinate on every axis."""
        if not 0 <= rank < self.world:
            raise ValueError(f"rank {rank} is not in a grid of {self.world}")
        return {a: rank // self.strides[a] % self.sizes[a] for a in self.axes}

    def rank(self, **coords: int) -> int:
        """The rank at ``coords`` (every axis named once)."""
        if set(coords) != set(self.axes):
            raise ValueError(f"give every axis of {self.order!r} once, got {sorted(coords)}")
        return sum(coords[a] * self.strides[a] for a in self.axes)

    def _axes(self, names: tuple[str, ...]) -> tuple[str, ...]:
        unknown = [n for n in names if n not in self.axes]
        if unknown or len(set(names)) != len(names):
            raise ValueError(f"group over {names}: each an axis of {self.order!r} once")
        return tuple(a for a in self.axes if a in names)  # the order string's order

    def group(self, rank: int, *names: str) -> tuple[int, ...]:
        """The ranks sharing ``rank``'s coordinates off ``names``, by their coordinates on ``names`` (the order
        string's earliest fastest)."""
        inside = self._axes(names)
        base = rank - sum(self.coords(rank)[a] * self.strides[a] for a in inside)
        # itertools.product varies its last factor fastest: give it the axes latest first
        return tuple(base + sum(i * self.strides[a] for a, i in zip(inside[::-1], idx))
                     for idx in product(*(range(self.sizes[a]) for a in inside[::-1])))

    def groups(self, *names: str) -> list[tuple[int, ...]]:
        """Every group over ``names``, listed by the coordinates off them (the earliest axis fastest)."""
        seen: dict[tuple[int, ...], None] = {}
        for r in range(self.world):
            seen.setdefault(self.group(r, *names))
        return list(seen)

    def color(self, rank: int, *names: str) -> int:
        """Which group over ``names`` holds ``rank``: the index of its coordinates off ``names``."""
        inside, out, step = self._axes(names), 0, 1
        for a in self.axes:
            if a not in inside:
                out += self.coords(rank)[a] * step
                step *= self.sizes[a]
        return out

    def key(self, rank: int, *names: str) -> int:
        """``rank``'s place in its group over ``names``."""
        inside, out, step = self._axes(names), 0, 1
        for a in inside:
            out += self.coords(rank)[a] * step
            step *= self.sizes[a]
        return out
