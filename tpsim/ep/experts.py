"""The experts one rank holds: E/ep of the layer's E, each cut over the ETP group (expert tensor parallelism).

    ep rank r holds experts  ids = [r·E/ep, (r+1)·E/ep)              (Megatron-LM's local experts)
    etp rank q holds of each  gate, up [h, F/etp] columns q·F/etp ..  and  down [F/etp, h] the same rows

SwiGLU is elementwise in its F columns (``tpsim.tp.swiglu``), so an ETP rank computes a partial output of
every token it is given, and the ETP group's sum is the expert's output — the dispatcher does that sum (a
reduce-scatter). **Grouped**: an expert runs once per call, one matmul per projection over all the rows it
got (the serial layer's rule, ``tpsim.nn.moe``); an expert that got none does not run.
"""

from __future__ import annotations

import numpy as np

from tpsim.nn.linear import Linear
from tpsim.nn.module import Module
from tpsim.nn.multi_output_linear import MultiOutputLinear
from tpsim.nn.swiglu import GatedMLP, SwiGLU
from tpsim.partition import Partition, divide, shard_range


def expert_ids(experts: int, ep: int, ep_rank: int) -> range:
    """The global indices of the experts EP rank ``ep_rank`` holds."""
    return shard_range(experts, ep, ep_rank, "the number of experts")


def expert_shard(mlp: SwiGLU, etp: int, etp_rank: int) -> GatedMLP:
    """ETP rank ``etp_rank``'s columns of gate and up and rows of down, each marked with its ``Partition``."""
    cols = np.arange(mlp.intermediate)[shard_range(mlp.intermediate, etp, etp_rank, "the expert FFN width")]
    full = mlp.intermediate
    gate, up = (Linear(mlp.hidden, len(cols), bias=False, weight=p.params["weight"][:, cols],
                       dtype=p.params["weight"].dtype) for p in (mlp.gate_proj, mlp.up_proj))
    down = Linear(len(cols), mlp.hidden, bias=False, weight=mlp.down_proj.params["weight"][cols],
                  dtype=mlp.down_proj.params["weight"].dtype)
    if etp > 1:
        for lin in (gate, up):
            lin.partition["weight"] = Partition(dim=1, index=cols, full=full)
        down.partition["weight"] = Partition(dim=0, index=cols, full=full)
    return GatedMLP(MultiOutputLinear({"gate_proj": gate, "up_proj": up}), down)


class LocalExperts(Module):
    """``experts``: this rank's ETP shards of experts ``ids`` (global indices) of a serial layer."""

    inline = True  # named experts.<i> under the layer, as the serial layer's list

    def __init__(self, experts: list, ids: range, etp: int) -> None:
        super().__init__()
        self.experts, self.ids, self.etp = list(experts), ids, etp

    def children(self) -> dict[str, Module]:
        """Named by their global index, as in the serial layer: ``experts.{e}`` (a checkpoint's names)."""
        return {f"experts.{e}": m for e, m in zip(self.ids, self.experts)}

    @classmethod
    def from_serial(cls, serial_experts: list, ep: int, ep_rank: int, etp: int, etp_rank: int) -> "LocalExperts":
        divide(len(serial_experts), ep, "the number of experts")
        ids = expert_ids(len(serial_experts), ep, ep_rank)
        return cls([expert_shard(serial_experts[e], etp, etp_rank) for e in ids], ids, etp)

    def forward(self, x: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, list]:
        """``x [Σ counts, h]``, rows of local expert l the l-th block -> (the (partial, under ETP) outputs, caches)."""
        out = np.empty_like(x)
        caches, start = [], 0
        for expert, n in zip(self.experts, counts):
            if n:
                out[start:start + n], cache = expert.forward(x[start:start + n])
                caches.append(cache)
            else:
                caches.append(None)
            start += n
        return out, caches

    def backward(self, dout: np.ndarray, counts: np.ndarray, caches: list) -> np.ndarray:
        """The rows' input gradients (partial under ETP); adds into every expert's weight gradients."""
        dx = np.empty_like(dout)
        start = 0
        for expert, n, cache in zip(self.experts, counts, caches):
            if n:
                dx[start:start + n] = expert.backward(dout[start:start + n], cache)
            start += n
        return dx
