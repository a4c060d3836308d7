"""What ``--cp``, ``--cp-comm`` and ``--cp-layout`` may be, checked before any work (pure arithmetic, no MPI).

    ring        K/V passed around the CP ring one step at a time, partial attention merged by log-sum-exp
                (Liu et al. 2023); the layout matters: zigzag balances the causal work, contiguous does not
    allgather   K/V all-gathered before attention, their gradients reduce-scattered after (Llama 3's choice)
    ulysses     all-to-all from sequence shards to head shards and back (Jacobs et al. 2023, DeepSpeed-Ulysses):
                the heads a TP rank holds, and its KV heads, must divide by cp

Each refusal is one line naming the constraint (``ConfigError``).
"""

from __future__ import annotations

from tpsim.errors import ConfigError

CP_COMMS = ("ring", "allgather", "ulysses")
CP_LAYOUTS = ("zigzag", "contiguous")


def check_names(comm: str, layout: str) -> None:
    """``ConfigError`` for an unknown ``--cp-comm`` or ``--cp-layout``."""
    if comm not in CP_COMMS:
        raise ConfigError(f"--cp-comm {comm!r}: one of {', '.join(CP_COMMS)}")
    if layout not in CP_LAYOUTS:
        raise ConfigError(f"--cp-layout {layout!r}: one of {', '.join(CP_LAYOUTS)}")


def chunks(cp: int, layout: str) -> int:
    """How many equal chunks the sequence is cut into: 2·cp for zigzag (rank r holds r and 2cp − 1 − r), cp."""
    return 2 * cp if layout == "zigzag" and cp > 1 else cp


def check_sizes(par, model, seq_len: int) -> None:
    """``ConfigError`` unless a sequence of ``seq_len`` and ``model``'s heads cut over ``par.cp`` ranks."""
    cp = par.cp
    if cp == 1:
        return
    parts = chunks(cp, par.cp_layout)
    if seq_len % parts:
        why = f"{par.cp_layout} over cp {cp}: " + (f"2 x cp = {parts} chunks" if par.cp_layout == "zigzag"
                                                   else f"{cp} shards")
        raise ConfigError(f"--seq-len {seq_len} is not divisible by {parts} ({why})")
    if par.sp and (seq_len // cp) % par.tp:
        raise ConfigError(f"--seq-len {seq_len} / cp {cp} = {seq_len // cp} tokens per CP rank is not divisible by "
                          f"tp {par.tp} (sequence parallelism splits them further)")
    if par.cp_comm == "ulysses":
        heads, kv = model.heads // par.tp, max(model.kv_heads // par.tp, 1)
        if heads % cp or kv % cp:
            raise ConfigError(f"--cp-comm ulysses: {heads} query and {kv} KV heads per TP rank must both divide by "
                              f"cp {cp} (the all-to-all gives each CP rank whole heads)")


def check_clock(cp: int, clock: str, unit: str = "unit") -> None:
    """``ConfigError`` for a GPU ``--clock`` with cp > 1: the live virtual clock does not price CP messages
    (the planner's ``--cp`` does: ``tpsim plan --cp``)."""
    if cp > 1 and clock != unit:
        raise ConfigError(f"--clock {clock} with --cp {cp}: the live virtual clock does not price context-parallel "
                          f"messages; use the unit clock here and tpsim plan --cp {cp} for time on a GPU")
