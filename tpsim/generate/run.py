"""One ``tpsim.generate`` run: read the folder on every rank, shard, decode, and read the trace.

Every check that can fail (the folder, the sizes against TP, prompt ids within the vocabulary) runs on every
rank before the first collective, so a bad input is one line and exit 2 everywhere.
"""

from __future__ import annotations

import numpy as np

from tpsim.arch import architecture_of
from tpsim.errors import ConfigError
from tpsim.generate.argmax import check_tie_rules
from tpsim.generate.check import against_serial
from tpsim.generate.decode import DECODE, PREFILL, greedy, max_positions
from tpsim.generate.report import (collective_counts, describe_counts, kv_cache_bytes, kv_table, latency_table,
                                   predicted_decode, step_events)
from tpsim.hf.folder import read_folder
from tpsim.hf.checkpoint import load_into


def serial_model(config, tensors: dict, dtype):
    """The serial model holding ``tensors``."""
    model = architecture_of(config).serial(config, 0, dtype)
    load_into(model, tensors)
    return model


def parallel_model(config, tensors: dict, group, dtype):
    """This rank's TP shard of the model holding ``tensors`` (built from the serial master, then sharded)."""
    return architecture_of(config).parallel(serial_model(config, tensors, dtype), group)


def check_inputs(config, args) -> None:
    config.check(args.tp)
    bad = args.prompt_ids[(args.prompt_ids < 0) | (args.prompt_ids >= config.vocab_size)]
    if bad.size:
        raise ConfigError(f"--prompt id {int(bad[0])} is outside the vocabulary [0, {config.vocab_size})")
    if args.max_new_tokens < 1:
        raise ConfigError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    need = args.prompt_ids.shape[1] + args.max_new_tokens - 1
    if need > max_positions(config):
        raise ConfigError(f"prompt {args.prompt_ids.shape[1]} + {args.max_new_tokens} new tokens needs {need} "
                          f"positions, the model has {max_positions(config)}")


def run(args):
    """-> ``(result dict, lines, ok)`` on rank 0, ``(None, [], ok)`` elsewhere."""
    from tpsim.comm import ProcessGrid

    dtype = np.dtype(args.dtype)
    config, tensors = read_folder(args.init_from, dtype)
    check_inputs(config, args)
    grid = ProcessGrid(tp=args.tp, dp=1)
    model = parallel_model(config, tensors, grid.tp_group, dtype)
    grid.tracer.reset()
    logits = []
    tokens, caches = greedy(model, args.prompt_ids, args.max_new_tokens, grid.tracer, logits)
    ok, check_lines = True, []
    if args.check_serial:
        ok, check_lines = check_serial(grid, config, tensors, dtype, args, tokens, logits)
    if grid.rank != 0:
        return None, [], ok
    return report(args, config, grid, tokens, caches, dtype, check_lines, ok)


def check_serial(grid, config, tensors, dtype, args, tokens, logits) -> tuple[bool, list[str]]:
    """Serial decoding on rank 0 with and without the KV cache (untraced, ``tpsim.generate.check``) against the
    TP tokens and this rank's logit slices gathered there; the verdict broadcast: one exit status everywhere."""
    flag, lines = np.zeros(1, dtype=np.int8), []
    with grid.tracer.paused():
        slices = grid.tp_group.gather_objects(np.stack(logits))  # [K, b, Vp/p] per rank, in vocabulary order
        ties_ok, ties = check_tie_rules(grid.tp_group, config.vocab_size)  # the same on every rank of the group
        if grid.rank == 0:
            full = np.concatenate(slices, axis=-1)[..., :config.vocab_size]
            ok, lines = against_serial(serial_model(config, tensors, dtype), args.prompt_ids, tokens, full, grid.tp)
            flag[0] = ok and ties_ok
            lines = [ties, *lines]
        grid.world.broadcast(flag)
    return bool(flag[0]), lines


def report(args, config, grid, tokens, caches, dtype, check_lines, ok):
    c, b, k = config, args.prompt_ids.shape[0], args.max_new_tokens
    events = grid.tracer.events
    prefill, decode = step_events(events, 0), step_events(events, 1)
    live = sum(c.nbytes for c in caches)
    positions = caches[0].k.shape[2]
    formula = kv_cache_bytes(c.layers, b, positions, c.kv_heads, c.head_dim, dtype.itemsize, grid.tp)
    decode_ok = k < 2 or collective_counts(decode) == predicted_decode(c.layers, b, c.hidden, str(dtype))
    lines = [f"{c.arch}: {c.layers} layers, hidden {c.hidden}, {c.heads} heads, {c.kv_heads} kv heads, "
             f"vocab {c.vocab}; TP {grid.tp}, {dtype}",
             f"prompt {args.prompt_ids.tolist()}", f"generated {tokens.tolist()}", ""]
    lines += [f"prefill ({args.prompt_ids.shape[1]} positions, one forward): {len(prefill)} collectives, "
              f"{human(prefill)}: {describe_counts(collective_counts(prefill))}"]
    if k > 1:
        lines += [f"decode (per generated token): {len(decode)} collectives, {human(decode)}: "
                  f"{describe_counts(collective_counts(decode))}",
                  f"FORMULA CHECK: {'OK' if decode_ok else 'MISMATCH'} — 2·n_layer + 1 = {2 * c.layers + 1} "
                  f"all-reduces of [b, 1, h] (embedding, attention, MLP) + 2 of [b] (the argmax) per token", "",
                  latency_table(decode, grid.tp), ""]
    lines += [wall_clock(grid.tracer.spans), ""]
    lines += [kv_table(c.layers, b, positions, c.heads, c.kv_heads, c.head_dim, dtype.itemsize),
              f"this rank's KV cache: {live} bytes (formula {formula}): {'OK' if live == formula else 'MISMATCH'}"]
    lines += check_lines
    result = {"tokens": tokens.tolist(), "prompt": args.prompt_ids.tolist(), "tp": grid.tp,
              "arch": c.arch, "prefill_collectives": len(prefill),
              "decode_collectives_per_token": len(decode), "kv_cache_bytes_per_rank": live,
              "formula_ok": bool(decode_ok and live == formula), "serial_match": ok if args.check_serial else None}
    return result, lines, ok and decode_ok and live == formula


def wall_clock(spans) -> str:
    """This rank's measured seconds: the prefill, and the mean decode step (a simulator's, not a GPU's)."""
    prefill = sum(s.duration for s in spans if s.scope == PREFILL)
    decode = [s.duration for s in spans if s.scope == DECODE]
    mean = f"{sum(decode) / len(decode) * 1e3:.2f} ms per decode step" if decode else "no decode step"
    return f"wall clock on rank 0 (this simulator on CPUs): prefill {prefill * 1e3:.2f} ms, {mean}"


def human(events) -> str:
    from tpsim.table import human_bytes

    return human_bytes(sum(e.bytes for e in events))
