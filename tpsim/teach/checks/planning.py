"""The harder planning exercises: 08b, a (tp, dp) layout under a memory budget; 11b, predict the bytes, then run.

08b is arithmetic checked against a brute-force search over every layout with ``tpsim.predict.memory`` and
``tpsim.predict.formulas``; a wrong layout is explained by its own numbers (its memory against the budget, its
bytes against "a layout that fits sends less"), never by naming the right one. 11b runs real traced GPT steps
and compares the learner's predicted bytes per layer with the trace's, layer by layer.
"""

from __future__ import annotations

import numpy as np

from tpsim.errors import ConfigError
from tpsim.models.build import build_gpt
from tpsim.arch.gpt2 import GPTConfig
from tpsim.teach.checks.registry import exercise
from tpsim.teach.returned import describe
from tpsim.teach.verdict import Report
from tpsim.trace.aggregate import layer_of
from tpsim.config import RunConfig
from tpsim.predict.formulas import predict_step
from tpsim.predict.memory import predict_memory

GIB = 2 ** 30


def layout_cost(config: GPTConfig, tp: int, dp: int, batch: int, seq: int, dtype) -> tuple[int, int]:
    """``(memory bytes per rank, wire bytes per rank per step)`` of one layout; ``ConfigError`` if it is none."""
    config.check(tp)
    if batch % dp:
        raise ConfigError(f"dp={dp} does not divide the global batch of {batch}")
    memory = sum(predict_memory(config, tp, batch // dp, seq, dtype).values())
    run = RunConfig.of(config, tp=tp, dp=dp, batch_size=batch, seq_len=seq, dtype=dtype)
    return memory, sum(x.wire_bytes for x in predict_step(run, clip=False))


def best_layout(config: GPTConfig, world: int, batch: int, seq: int, dtype, budget: int) -> tuple[int, int] | None:
    """The brute-force answer: the fewest wire bytes among the layouts that fit, the smaller tp on a tie."""
    fits = []
    for tp in (t for t in range(1, world + 1) if world % t == 0):
        try:
            memory, wire = layout_cost(config, tp, world // tp, batch, seq, dtype)
        except ConfigError:
            continue
        if memory <= budget:
            fits.append((wire, tp))
    return None if not fits else (min(fits)[1], world // min(fits)[1])


def explain_layout(got, best, config: GPTConfig, world: int, batch: int, seq: int, dtype, budget: int) -> str | None:
    """Why ``got`` is not the right layout, in its own numbers; ``None`` when it is."""
    if got is None or best is None:
        if got is None and best is None:
            return None
        return ("you found no layout, but at least one fits in the budget" if got is None else
                f"no layout fits in {gib(budget)}; return None")
    pair = whole_pair(got)
    if pair is None:
        return f"return (tp, dp), two whole numbers, or None; yours returned {describe(got)}"
    tp, dp = pair
    if (tp, dp) == best:
        return None
    if tp * dp != world:
        return f"tp={tp} × dp={dp} = {tp * dp} is not a layout of the {world} ranks you were given"
    try:
        memory, wire = layout_cost(config, tp, dp, batch, seq, dtype)
    except ConfigError as err:
        return f"tp={tp}, dp={dp} is not a valid layout: {err}"
    if memory > budget:
        return f"tp={tp}, dp={dp} needs {gib(memory)} per rank > budget {gib(budget)}"
    best_wire = layout_cost(config, *best, batch, seq, dtype)[1]
    if wire == best_wire:
        return f"tp={tp}, dp={dp} fits and ties for the fewest bytes; on a tie take the smaller tp"
    return (f"tp={tp}, dp={dp} fits ({gib(memory)} ≤ {gib(budget)}) but each rank sends "
            f"{wire / GIB:.3f} GiB per step; a layout that fits sends less")


def whole_pair(got) -> tuple[int, int] | None:
    """``(tp, dp)`` when ``got`` is two whole numbers (ints, or floats/NumPy numbers with no fraction); text such as
    ``"12"``, a float like 1.9, a bool or anything else is None — never read as something it is not."""
    if isinstance(got, (str, bytes)) or not isinstance(got, (tuple, list, np.ndarray)) or len(got) != 2:
        return None
    if any(isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)) for v in got):
        return None
    if any(not np.isfinite(float(v)) or float(v) != int(v) for v in got):
        return None
    return int(got[0]), int(got[1])


def gib(nbytes: int) -> str:
    return f"{nbytes / GIB:.2f} GiB"


def budgets(config: GPTConfig, world: int, batch: int, seq: int, dtype) -> list[int]:
    """Budgets that make the search interesting: all fit; halfway between the cheapest layout's memory and the
    next smaller one (it no longer fits, a smaller one does); none fits."""
    costs = {}
    for tp in (t for t in range(1, world + 1) if world % t == 0):
        try:
            costs[tp] = layout_cost(config, tp, world // tp, batch, seq, dtype)
        except ConfigError:
            pass
    cheapest = min(costs, key=lambda t: (costs[t][1], t))
    memories = sorted(m for m, _ in costs.values())
    below = [m for m in memories if m < costs[cheapest][0]]
    middle = [(below[-1] + costs[cheapest][0]) // 2] if below else []
    return [memories[-1] + GIB // 10, *middle, memories[0] * 9 // 10]


@exercise("08b", "choose_layout",
          choose_layout=(
              "a layout is (tp, dp) with tp · dp = world; not every tp is allowed (heads must divide by tp) and dp "
              "must divide the global batch. Try them all: there are few",
              "memory per rank: sum(predict_memory(config, tp, batch // dp, seq, dtype).values()); "
              "communication: the wire_bytes of every row of predict_step(RunConfig.of(config, tp=tp, dp=dp, "
              "batch_size=batch, seq_len=seq, dtype=dtype), clip=False), summed",
              "keep the layouts whose memory ≤ budget; of those, the fewest wire bytes, the smaller tp on a tie; "
              "None when no layout fits"))
def check_08b(r: Report) -> None:
    scenarios = [(GPTConfig(vocab_size=50257, n_positions=1024, n_embd=768, n_layer=12, n_head=12), 16, 1024,
                  np.float32),
                 (GPTConfig(vocab_size=32000, n_positions=512, n_embd=1024, n_layer=8, n_head=16), 8, 512,
                  np.float64)]
    world = r.world_size
    for config, batch, seq, dtype in scenarios:
        for budget in budgets(config, world, batch, seq, dtype):
            got = r.call("choose_layout", config, world, batch, seq, np.dtype(dtype), budget)
            best = best_layout(config, world, batch, seq, dtype, budget)
            why = explain_layout(got, best, config, world, batch, seq, dtype, budget)
            r.compared += 1
            r.require(why is None, f"choose_layout(h={config.n_embd}, layers={config.n_layer}, heads="
                                   f"{config.n_head}, world={world}, batch={batch}, seq={seq}, "
                                   f"{np.dtype(dtype).name}, budget {budget / GIB:.2f} GiB)", why or "")


def traced_layer_bytes(r: Report, tp: int, b: int, s: int, config: GPTConfig, dtype) -> dict[str, list[int]]:
    """Run one forward and backward of a GPT on a TP group of ``tp`` and sum the trace by layer."""
    grid = r.grid(tp)
    model = build_gpt(config, grid.tp_group, seed=12, dtype=dtype)
    ids = np.random.default_rng(12).integers(0, config.vocab_size, (b, s))
    r.tracer.reset()
    model.loss_and_grads(ids, np.roll(ids, -1, axis=1))
    out: dict[str, list[int]] = {}
    for e in r.tracer.events:
        row = out.setdefault(layer_of(e.scope), [0, 0])
        row[0] += e.bytes
        row[1] += e.wire_bytes
    return out


@exercise("11b", "predict_layer_bytes",
          predict_layer_bytes=(
              "list the collectives of one forward and backward, layer by layer: the vocab-parallel embedding, "
              "attention and MLP in every block (forward and backward), the loss, the tied LM head",
              "every block's attention and MLP: a g forward and an f backward, each an all-reduce of one [b, s, h] "
              "activation; the embedding's g; the LM head's f; the loss's three [b, s] all-reduces. The "
              "vocabulary never travels",
              "wire bytes of an all-reduce: 2(p − 1)/p of its logical bytes (0 at p = 1, the same as logical at "
              "p = 2 — that is why lesson 11 uses TP 4)"))
def check_11b(r: Report) -> None:
    for tp, b, s, h, layers, dtype in [(4, 3, 8, 12, 2, np.float64), (2, 2, 5, 8, 1, np.float32),
                                       (4, 1, 7, 16, 3, np.float32), (1, 2, 3, 4, 1, np.float64)]:
        config = GPTConfig(vocab_size=13, n_positions=s, n_embd=h, n_layer=layers, n_head=4)
        measured = traced_layer_bytes(r, tp, b, s, config, dtype)
        itemsize = np.dtype(dtype).itemsize
        args = f"tp={tp}, b={b}, s={s}, h={h}, vocab=13, n_layer={layers}, itemsize={itemsize}"
        got = r.call("predict_layer_bytes", tp, b, s, h, 13, layers, itemsize)
        if not isinstance(got, dict):
            r.require(False, f"predict_layer_bytes({args})", f"return a dict {{layer: (bytes, wire_bytes)}}; yours "
                                                            f"returned {type(got).__name__}")
            return
        missing, extra = sorted(set(measured) - set(got)), sorted(set(got) - set(measured))
        r.require(not missing and not extra, f"the layers of predict_layer_bytes({args})",
                  f"the trace has collectives in layers your prediction lacks: {', '.join(missing) or 'none'}; "
                  f"your prediction has layers without any: {', '.join(extra) or 'none'}")
        for layer in (name for name in measured if name in got):
            logical, wire = measured[layer]
            try:
                mine_logical, mine_wire = (float(v) for v in got[layer])
            except (TypeError, ValueError):
                r.require(False, f"{layer}", f"give (bytes, wire_bytes) for every layer; yours: {got[layer]!r}")
                continue
            r.compare(f"{layer} logical bytes, {args}", mine_logical, float(logical), tol=0.5,
                      symptoms={"half the trace's: the backward's collectives are missing": logical / 2,
                                "the [tokens, V] logits never travel: the loss all-reduces [b, s] numbers":
                                    float(b * s * 13 * itemsize) if layer == "loss" else None})
            r.compare(f"{layer} wire bytes, {args}", mine_wire, float(wire), tol=0.5,
                      symptoms={"your wire bytes equal the logical bytes: the ring's factor is missing":
                                float(logical), "half the trace's: the backward's collectives are missing": wire / 2})
