"""Which machine each rank runs on, and whether a tensor-parallel group crosses between machines (MPI-free).

Megatron's rank order makes TP the fastest-varying coordinate (``tpsim.comm.grid``), and ``mpiexec`` fills
each machine with consecutive ranks, so with ``ranks per machine`` a multiple of TP every TP group lies inside
one machine: its all-reduces — two per layer per pass — stay on the fast links, and only the data-parallel
all-reduce (once per step) crosses between machines (the SenseParrots article §3.1; Narayanan et al. 2021,
arXiv:2104.04473). ``ProcessGrid`` gathers every rank's host name once when it is built; the functions here
turn that list into the host lines of the grid table and the warning when a TP group spans hosts.

``TPSIM_FAKE_HOSTS`` (for tests and demonstrations only) replaces the real names: one name per rank,
``name*count`` for runs of one name, e.g. ``TPSIM_FAKE_HOSTS="node-a*4,node-b*4"`` at 8 ranks.
"""

from __future__ import annotations

from tpsim.errors import ConfigError

FAKE_HOSTS_ENV = "TPSIM_FAKE_HOSTS"


def parse_fake_hosts(spec: str, world: int) -> list[str]:
    """``"a*2,b,c"`` -> ``["a", "a", "b", "c"]``; one name per rank of the world, or a ConfigError."""
    names: list[str] = []
    for item in (part.strip() for part in spec.split(",")):
        name, star, count = item.partition("*")
        if not name or (star and not count.strip().isdigit()):
            raise ConfigError(f"{FAKE_HOSTS_ENV}={spec!r}: {item!r} is not NAME or NAME*COUNT")
        names += [name.strip()] * (int(count) if star else 1)
    if len(names) != world:
        raise ConfigError(f"{FAKE_HOSTS_ENV}={spec!r} names {len(names)} ranks, but the world has {world}")
    return names


def rank_ranges(ranks: list[int]) -> str:
    """``[0, 1, 2, 3, 6]`` -> ``"0-3, 6"``."""
    runs: list[list[int]] = []
    for r in sorted(ranks):
        if runs and r == runs[-1][-1] + 1:
            runs[-1].append(r)
        else:
            runs.append([r])
    return ", ".join(f"{run[0]}-{run[-1]}" if len(run) > 1 else f"{run[0]}" for run in runs)


def _distinct(names) -> list[str]:
    return list(dict.fromkeys(names))  # first-seen order


def row_hosts(tp_group: list[int], hosts: list[str]) -> str:
    """The host(s) of one TP group's ranks, e.g. ``"node-a"`` or ``"node-a, node-b"``."""
    return ", ".join(_distinct(hosts[r] for r in tp_group))


def tp_groups_spanning_hosts(tp_groups: list[list[int]], hosts: list[str]) -> list[list[int]]:
    """The TP groups whose ranks are not all on one host."""
    return [group for group in tp_groups if len({hosts[r] for r in group}) > 1]


def host_lines(tp_groups: list[list[int]], hosts: list[str]) -> list[str]:
    """The lines the grid table adds when the ranks span more than one host ([] on one host)."""
    names = _distinct(hosts)
    if len(names) < 2:
        return []
    lines = [f"  host {name}: ranks {rank_ranges([r for r, h in enumerate(hosts) if h == name])}" for name in names]
    spanning = tp_groups_spanning_hosts(tp_groups, hosts)
    tp = len(tp_groups[0])
    if not spanning:
        lines.append(f"  {len(names)} hosts, every TP group inside one: TP all-reduces stay on fast links, "
                     f"only DP traffic crosses hosts")
        return lines
    first = spanning[0]
    more = f" (and {len(spanning) - 1} more TP groups)" if len(spanning) > 1 else ""
    lines.append(f"WARNING: TP group {first} spans hosts {row_hosts(first, hosts)}: its all-reduces cross the "
                 f"slow link{more}; put a multiple of TP={tp} ranks on each host")
    return lines
