"""The one cost rule (``tpsim.pipeline.cost_rule``) against an independent reference, and the clocks that call it.

The reference does not walk the nodes in order: it states the rule as the longest-path equations of the step's
graph — a node starts at the latest of its rank's start, the end of the node before it on its rank, and the end
of the node it waits for plus the hop — and relaxes them until nothing moves (Bellman–Ford on a DAG), in a
random order each pass. The rule's one forward walk must reach the same fixed point.
"""

from __future__ import annotations

import ast
import random
from pathlib import Path

import pytest

from tpsim.pipeline.cost_rule import begin, price

ROOT = Path(__file__).resolve().parents[1]


def random_nodes(seed: int, ranks: int = 4, n: int = 60, integer: bool = False):
    """A random runnable node list: each node on a random rank, waiting (half the time) for an earlier node of
    another rank plus a hop."""
    rng = random.Random(seed)
    rank, dep, hop, cost = [], [], [], []
    for k in range(n):
        r = rng.randrange(ranks)
        others = [i for i in range(k) if rank[i] != r]
        d = rng.choice(others) if others and rng.random() < 0.5 else -1
        rank.append(r)
        dep.append(d)
        hop.append(rng.randrange(4) if integer else rng.uniform(0, 2))
        cost.append(rng.randrange(1, 5) if integer else rng.uniform(0.1, 3))
    return rank, dep, hop, cost


def relaxed(rank, dep, hop, cost, ranks, start, seed):
    """The reference: start times as the fixed point of the longest-path equations, relaxed in random order."""
    rng = random.Random(seed)
    before = {}
    last = {}
    for k, r in enumerate(rank):
        before[k] = last.get(r, -1)
        last[r] = k
    s = {k: start[r] for k, r in enumerate(rank)}
    changed = True
    while changed:
        changed = False
        order = list(range(len(rank)))
        rng.shuffle(order)
        for k in order:
            bounds = [start[rank[k]]]
            if before[k] >= 0:
                bounds.append(s[before[k]] + cost[before[k]])
            if dep[k] >= 0:
                bounds.append(s[dep[k]] + cost[dep[k]] + hop[k])
            if max(bounds) > s[k]:
                s[k], changed = max(bounds), True
    return [s[k] for k in range(len(rank))]


@pytest.mark.parametrize("seed", range(8))
def test_the_walk_reaches_the_fixed_point_of_the_longest_path_equations(seed):
    rank, dep, hop, cost = random_nodes(seed)
    start = [random.Random(seed).uniform(0, 5) for _ in range(4)]
    out = price(rank, dep, hop, cost, 4, start)
    ref = relaxed(rank, dep, hop, cost, 4, start, seed)
    assert out.starts == pytest.approx(ref, rel=1e-15, abs=0)
    assert out.ends == pytest.approx([s + c for s, c in zip(ref, cost)], rel=1e-15, abs=0)
    for r in range(4):  # a rank's clock is its last node's end, or its start when it ran none
        mine = [out.ends[k] for k in range(len(rank)) if rank[k] == r]
        assert out.clocks[r] == (mine[-1] if mine else start[r])


@pytest.mark.parametrize("seed", range(4))
def test_integer_costs_give_integer_times_exactly(seed):
    """The textbook's unit clock relies on it: no float creeps in."""
    rank, dep, hop, cost = random_nodes(seed, integer=True)
    out = price(rank, dep, hop, cost, 4)
    assert all(type(t) is int for t in out.starts + out.ends + out.clocks)
    assert out.starts == relaxed(rank, dep, hop, cost, 4, [0] * 4, seed)


def test_a_node_given_as_a_function_of_its_start_replaces_its_cost_and_moves_what_waits_for_it():
    # rank 0: node 0 (cost 1, replaced: ends at start + 10); rank 1: node 1 waits for node 0 plus a hop of 2
    out = price([0, 1, 0], [-1, 0, -1], [0, 2, 0], [1, 1, 1], 2, runs={0: lambda t: t + 10})
    assert out.starts == [0, 12, 10] and out.ends == [10, 13, 11] and out.clocks == [11, 13]


def test_begin_is_the_later_of_the_rank_free_and_the_input_there():
    assert begin(3, 5) == 5 and begin(5, 3) == 5 and begin(4, 4) == 4


@pytest.mark.parametrize("module", ["tpsim/pipeline/clock.py", "tpsim/pipeline/stage_clock.py",
                                    "tpsim/live_pipeline/clock.py", "tpsim/plan/param_gather.py"])
def test_every_clock_times_by_the_rule_and_none_keeps_its_own_loop(module):
    """The unit clock, the compiled clock, the live clock and the gated planner clock import the rule (or the
    compiled clock that calls it), and none of them holds a ``max(clock, arrival)`` of its own."""
    tree = ast.parse((ROOT / module).read_text())
    imported = {(node.module, a.name) for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                for a in node.names}
    assert imported & {("tpsim.pipeline.cost_rule", "price"), ("tpsim.pipeline.cost_rule", "begin"),
                       ("tpsim.pipeline.stage_clock", "timed")}
    timing = ("clock", "time", "arriv", "start", "sent")
    calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "max"
             and len(node.args) == 2 and any(w in ast.unparse(node).lower() for w in timing)]
    assert not calls, f"{module} restates the cost rule: {[ast.unparse(c) for c in calls]}"
