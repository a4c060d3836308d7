"""Proof that the replicas agree: replicated parameters equal across TP, every parameter equal across DP.

TP × DP training is only correct while two invariants hold (they are what ``broadcast_params`` establishes,
§3.1 of the SenseParrots article, and what identical averaged gradients preserve):

    (a) a **replicated** parameter (no ``Partition``) is bit-for-bit the same on every rank of a TP group;
    (b) **every** parameter (shard) is bit-for-bit the same on every rank of a DP group — an expert's
        (``tpsim.ep``) on every rank of its expert-DP group, reported in the DP group's row by its place in the
        parameter list (its name as rank 0 holds that place).

Comparing whole tensors would move the model over the network. Instead each rank hashes each parameter
(BLAKE2b of dtype, shape and bytes -> an 8-byte digest read as ``uint64``) and the groups compare digests:

    TP group:  all_gather(digests of replicated params)  [tp, n_replicated]  -> which differ in my TP group
    DP group:  all_gather(digests of all params)         [dp, n_params]      -> which differ in my DP group
    world:     all_reduce(MAX) of a [dp·n_replicated + tp·n_params] flag vector -> the same verdict everywhere

The last step matters because a perturbed shard on one rank is visible only inside *its* DP group; the world
MAX tells every rank about every group, so the report (and ``ok``) is identical on all ranks and a caller can
act on it without deadlocking. All three are traced with phase "verify", scope "check_replicas". Bitwise
equality is the right test: replicas that run the same deterministic updates from the same bits never drift.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from tpsim.ep.params import expert_param_names
from tpsim.comm import ProcessGrid
from tpsim.nn.module import Module
from tpsim.phases import VERIFY


def param_digest(p: np.ndarray) -> bytes:
    """8-byte BLAKE2b of a parameter's dtype, shape and bytes (stable across processes and runs)."""
    h = hashlib.blake2b(digest_size=8)
    h.update(f"{p.dtype.str}{p.shape}".encode())
    h.update(np.ascontiguousarray(p).reshape(-1).view(np.uint8).data)  # bytes: bfloat16 has no buffer format
    return h.digest()


def _digests(arrays: list[np.ndarray]) -> np.ndarray:
    """``uint64 [len(arrays)]``: one digest per array."""
    return np.frombuffer(b"".join(param_digest(p) for p in arrays), dtype="<u8").astype(np.uint64)


def _differs(group, digests: np.ndarray) -> np.ndarray:
    """int8 [n]: 1 where the group's ranks do not all hold the same digest (one all_gather)."""
    if group.size == 1 or digests.size == 0:
        return np.zeros(digests.size, dtype=np.int8)
    gathered = group.all_gather(digests[None, :], axis=0)  # [group size, n]
    return (gathered != gathered[0]).any(axis=0).astype(np.int8)


@dataclass(frozen=True)
class Mismatch:
    """Parameter ``name`` is not the same on all ``ranks`` (world ranks) of one ``group`` ("tp" or "dp")."""

    name: str
    group: str
    ranks: tuple[int, ...]


@dataclass(frozen=True)
class ConsistencyReport:
    """The verdict of ``check_replicas``, identical on every rank."""

    n_params: int  # parameters checked across DP (each tied array once)
    n_replicated: int  # of those, replicated across TP (checked across TP too)
    tp: int
    dp: int
    mismatches: tuple[Mismatch, ...]

    @property
    def ok(self) -> bool:
        return not self.mismatches

    @property
    def names(self) -> list[str]:
        """The offending parameter names, each once, in the order found."""
        return list(dict.fromkeys(m.name for m in self.mismatches))

    def summary(self) -> str:
        """One line, e.g. ``replicas consistent: 26 params identical across DP (2 replicas), ...``."""
        if self.ok:
            return (f"replicas consistent: {self.n_params} params identical across DP ({self.dp} "
                    f"{'replica' if self.dp == 1 else 'replicas'}), {self.n_replicated} replicated params "
                    f"identical across TP ({self.tp} {'rank' if self.tp == 1 else 'ranks'})")
        parts = [f"{m.name} differs in {m.group.upper()} group {list(m.ranks)}" for m in self.mismatches]
        return f"replicas INCONSISTENT ({len(parts)} mismatches): " + "; ".join(parts)


def check_replicas(module: Module, grid: ProcessGrid) -> ConsistencyReport:
    """Check invariants (a) and (b) of the module docstring; collective over the whole world (every rank calls);
    with pipeline stages each stage checks its own parameters and its ranks share the verdict.

    ``module``: this rank's model (shards + replicated parameters). Returns the same ``ConsistencyReport`` on
    every rank. Cost: at most one all_gather in the TP group, one in the DP group and one world all-reduce, of
    8 bytes per parameter.
    """
    entries, experts = list(module.named_entries()), expert_param_names(module)
    names = [e.name for e in entries]
    replicated = [i for i, e in enumerate(entries) if e.partition is None and e.name not in experts]
    dense = [i for i, e in enumerate(entries) if e.name not in experts]
    held = [i for i, e in enumerate(entries) if e.name in experts]  # an expert's twins: its expert-DP group
    digests = _digests([e.param for e in entries])
    n, n_rep = len(entries), len(replicated)

    # row g of tp_bad / column t of dp_bad: filled by the ranks of TP group g / DP group t, zero elsewhere
    tp_bad = np.zeros((grid.replicas, n_rep), dtype=np.int8)
    dp_bad = np.zeros((grid.tp, n), dtype=np.int8)
    with grid.tracer.region(scope="check_replicas", phase=VERIFY):
        tp_bad[grid.replica_rank] = _differs(grid.tp_group, digests[replicated])
        dp_bad[grid.tp_rank, dense] = _differs(grid.dp_group, digests[dense])
        if held:
            dp_bad[grid.tp_rank, held] = _differs(grid.group("edp"), digests[held])
        flags = np.concatenate([tp_bad.ravel(), dp_bad.ravel()])
        if grid.stage_group.size > 1 and flags.size:  # the world, or one pipeline stage (its own parameters)
            flags = grid.stage_group.all_reduce(flags, op="max")
    tp_bad, dp_bad = flags[:tp_bad.size].reshape(tp_bad.shape), flags[tp_bad.size:].reshape(dp_bad.shape)

    found = [Mismatch(names[replicated[j]], "tp", tuple(int(r) for r in grid.layout[g]))
             for g, j in zip(*np.nonzero(tp_bad))]
    found += [Mismatch(names[j], "dp", tuple(int(r) for r in grid.layout[:, t]))
              for t, j in zip(*np.nonzero(dp_bad))]
    return ConsistencyReport(n_params=n, n_replicated=n_rep, tp=grid.tp, dp=grid.replicas, mismatches=tuple(found))
