"""The 1F1B pipeline schedule as data: each stage's actions, their times, and a printable time × stage grid.

Narayanan et al. 2021 (arXiv:2104.04473), §2.2.1: stage i of p runs p − i − 1 warm-up forwards, then
alternates one forward and one backward, then drains the backwards left (Megatron-LM's warm-up count
``p − rank − 1``). So stage i has run p − i forwards when its first backward comes, and holds at most min(p − i, m)
micro-batches' activations. A forward of micro-batch j on stage i waits for stage i − 1's; a backward for stage
i + 1's. With every forward taking ``tf`` and every backward ``tb``, each stage is busy m·(tf + tb) and idle
(p − 1)·(tf + tb) of the step: the bubble, (p − 1)/m of the compute. ``simulate`` computes the times from the
dependencies (no formula), so the lesson can check that claim; communication takes no time here.

    actions(p, m)[i]          [("F", 0), ("F", 1), ..., ("B", 0), ...]   stage i's order
    simulate(p, m, tf, tb)    {(stage, kind, micro-batch): (start, end)}
    grid(p, m, tf, tb)        one text row per stage, one column per time unit: "F3", "B3", or "." idle
"""

from __future__ import annotations


def actions(p: int, m: int) -> list[list[tuple[str, int]]]:
    """Each stage's 1F1B order of ``("F" | "B", micro-batch)``."""
    out = []
    for stage in range(p):
        warm = min(p - stage - 1, m)
        order = [("F", j) for j in range(warm)]
        for k in range(m - warm):
            order += [("F", warm + k), ("B", k)]
        out.append(order + [("B", j) for j in range(m - warm, m)])
    return out


def depends_on(p: int, stage: int, kind: str, j: int) -> tuple[int, str, int] | None:
    """What action ``(stage, kind, j)`` waits for: the previous stage's forward of j, the next stage's backward
    of j (the last stage: its own forward of j); ``None`` for the first stage's forwards."""
    if kind == "F":
        return (stage - 1, "F", j) if stage > 0 else None
    return (stage + 1, "B", j) if stage < p - 1 else (stage, "F", j)


def simulate(p: int, m: int, tf: int = 1, tb: int = 2) -> dict[tuple[int, str, int], tuple[int, int]]:
    """Start and end of every action: as early as its stage is free and what it depends on has finished."""
    todo, done, free = actions(p, m), {}, [0] * p
    while any(todo):
        ran = False
        for stage in (i for i in range(p) if todo[i]):
            kind, j = todo[stage][0]
            dep = depends_on(p, stage, kind, j)
            if dep is not None and dep not in done:
                continue
            start = max(free[stage], 0 if dep is None else done[dep][1])
            free[stage] = start + (tf if kind == "F" else tb)
            done[(stage, kind, j)] = (start, free[stage])
            todo[stage].pop(0)
            ran = True
        if not ran:
            raise RuntimeError(f"1F1B with p = {p}, m = {m} deadlocked")  # a wrong order would; 1F1B does not
    return done


def in_flight(p: int, m: int) -> list[int]:
    """The most micro-batches each stage holds activations for at once (forwards run, backwards not yet)."""
    most = []
    for order in actions(p, m):
        held = peak = 0
        for kind, _ in order:
            held += 1 if kind == "F" else -1
            peak = max(peak, held)
        most.append(peak)
    return most


def idle(p: int, m: int, tf: int = 1, tb: int = 2) -> list[int]:
    """Each stage's idle time between the step's first action and its last (the bubble, stage by stage)."""
    times = simulate(p, m, tf, tb)
    step = max(end for _, end in times.values())
    return [step - sum(end - start for (s, _, _), (start, end) in times.items() if s == stage)
            for stage in range(p)]


def grid(p: int, m: int, tf: int = 1, tb: int = 2) -> list[str]:
    """The schedule drawn: row i is stage i, a column per time unit (a backward fills ``tb`` of them)."""
    times = simulate(p, m, tf, tb)
    step = max(end for _, end in times.values())
    width = len(str(m - 1)) + 1
    rows = [[".".rjust(width)] * step for _ in range(p)]
    for (stage, kind, j), (start, end) in times.items():
        for slot in range(start, end):
            rows[stage][slot] = f"{kind}{j}".rjust(width)
    return [f"stage {stage}  " + " ".join(row) for stage, row in enumerate(rows)]
