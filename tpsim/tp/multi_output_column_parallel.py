"""Several column-parallel linears reading one input, as one layer entered once: one f (or f̄) for all of them.

Llama keeps q_proj, k_proj and v_proj (and the MLP's gate_proj and up_proj) as separate weights where GPT-2
fuses them into one c_attn (c_fc). Run as separate ``ColumnParallelLinear`` layers they would each all-reduce
their input gradient — three all-reduces in attention's backward instead of one. Their input is the same
tensor, so its gradient is the *sum* of theirs: add the partial sums locally, then let one f backward
(all-reduce; under SP one f̄ backward, reduce-scatter) finish it. Forward: f̄ gathers the sequence once.

    forward   x --f--> x·W_1, x·W_2, ...                        (SP: x_r --f̄ all-gather--> x, once)
    backward  dx = f_backward(Σ_j dy_j·W_jᵀ)                      one all-reduce (SP: one reduce-scatter)
              dW_j = xᵀ·dy_j                                      (SP: x all-gathered again, once)

Megatron-LM gets the same single collective by fusing the weights into one ``linear_qkv``/``linear_fc1``. Here
the parts stay ``ColumnParallelLinear`` layers with their own shards, gradients and Hugging Face names; this
layer is their serial twin's (``tpsim.nn.multi_output_linear``) and ``inline`` like it, so its collectives
carry the path of the layer it sits in (``model.layers.0.self_attn``).

**Replicated parts.** A part whose shard several ranks hold alike (a grouped-query KV head replicated over
tp / kv_heads ranks, ``tpsim.tp.gqa_attention``) gets only a partial weight gradient on each: the rank's own
share of the query heads that read it. ``replica_group`` (the ranks holding the same copy) sums the *new*
contribution of the ``replicated`` parts in one message — ``[n_parts, in, out/p]``, scope the layer's, phase
``backward`` — before it is added into the gradients, so what they held already is not summed again.

The weight gradients, that all-gather of x under SP and that sum are the layer's W (``Module.weight_grad``):
a zero-bubble pipeline runs them apart from the input gradient, every TP rank at the same action, so they meet.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from tpsim.comm import Group
from tpsim.kinds import MATMUL_MARK
from tpsim.nn.linear import LinearCache, linear_backward_weight
from tpsim.nn.module import Module
from tpsim.nn.multi_output_linear import MultiOutputLinear, check_parts
from tpsim.phases import BACKWARD
from tpsim.tp.column_parallel import ColumnParallelLinear
from tpsim.tp.regions import TP_REGION, Region


class MultiOutputColumnParallelLinear(Module):
    """``parts``: name -> ``ColumnParallelLinear(gather_output=False)``, one group, one region, one input width."""

    inline = True

    def __init__(self, parts: Mapping[str, ColumnParallelLinear], *, replica_group: Group | None = None,
                 replicated: Sequence[str] = ()) -> None:
        super().__init__()
        check_parts(parts)
        first = next(iter(parts.values()))
        if any(p.gather_output or p.group is not first.group or p.region is not first.region for p in parts.values()):
            raise ValueError("the parts of a multi-output column-parallel linear need gather_output=False, "
                             "one group and one region")
        if (replica_group is None) != (not replicated) or not set(replicated) <= set(parts):
            raise ValueError(f"replicated parts {tuple(replicated)} need a replica_group, and must be parts")
        if any("bias" in parts[name].params for name in replicated):
            raise ValueError("a replicated part must have no bias (only weight gradients are summed)")
        for name, part in parts.items():
            setattr(self, name, part)
        self.names, self.replicated = tuple(parts), tuple(replicated)
        self.group, self.region, self.replica_group = first.group, first.region, replica_group
        self.in_features = first.in_features

    @classmethod
    def from_serial(cls, linear: MultiOutputLinear, group: Group, *, region: Region = TP_REGION,
                    columns: Mapping[str, np.ndarray] | None = None, replica_group: Group | None = None,
                    replicated: Sequence[str] = ()) -> "MultiOutputColumnParallelLinear":
        """This rank's columns of every part (``columns[name]``, default the contiguous n/p); a ``replicated``
        part is copy number ``replica_group.rank`` of its shard."""
        columns = columns or {}
        parts = {name: ColumnParallelLinear.from_serial(
                     part, group, gather_output=False, columns=columns.get(name), region=region,
                     replica=replica_group.rank if name in replicated else 0)
                 for name, part in linear.parts().items()}
        return cls(parts, replica_group=replica_group, replicated=replicated)

    def parts(self) -> dict[str, ColumnParallelLinear]:
        """The parts by name, in the order of the outputs."""
        return {name: getattr(self, name) for name in self.names}

    def forward(self, x: np.ndarray) -> tuple[tuple[np.ndarray, ...], tuple[LinearCache, ...]]:
        """f (f̄) once, then ``x·W_j + b_j`` per part: ``x [..., in]`` (SP ``[b, s/p, in]``) -> ``y_j [..., out_j/p]``.

        The caches keep ``x`` as it arrived (under SP the shard, not f̄'s gathered output).
        """
        with self.group.tracer.region(scope=self.path):
            parts = list(self.parts().values())
            outs = self.region.enter_matmul(x, [part.params["weight"] for part in parts], self.group)
            caches = []
            for y, part in zip(outs, parts):
                if "bias" in part.params:
                    with MATMUL_MARK:  # the bias add rides along with its GEMM (tpsim.kinds)
                        y += part.params["bias"]
                caches.append(LinearCache(x, part.params["weight"], "bias" in part.params))
        return tuple(outs), tuple(caches)

    def backward(self, douts: Sequence[np.ndarray], caches: Sequence[LinearCache]) -> np.ndarray:
        """``dy_j [..., out_j/p]`` -> ``dx`` shaped as the input (summed over the parts and the ranks).

        W is two entries (``Module.weight_grad``), so that a whole backward keeps its collectives' order — SP's
        all-gather before f̄'s reduce-scatter, the replicas' sum after f's all-reduce: ``weight_grads_into``
        fills ``grads``, ``add_weight_grads`` sums the replicated parts and adds them all."""
        grads: dict[str, tuple] = {}  # filled by W's first entry, emptied by its second
        with self.group.tracer.region(scope=self.path):
            self.weight_grad(self.weight_grads_into, grads, tuple(douts), tuple(caches))
            dx = self.region.matmul_enter_backward(douts, [cache.w for cache in caches], self.group)
        self.weight_grad(self.add_weight_grads, grads)
        return dx

    def weight_grads_into(self, grads: dict, douts: tuple[np.ndarray, ...], caches: tuple[LinearCache, ...]) -> None:
        """W, first: every part's ``(dW_j = xᵀ·dy_j, db_j)`` into ``grads``, x all-gathered once under SP."""
        with self.group.tracer.region(scope=self.path):
            full = self.region.regather(caches[0].x, self.group)  # one all-gather under SP, not one per part
            grads.update((name, linear_backward_weight(dy, cache._replace(x=full)))
                         for name, dy, cache in zip(self.names, douts, caches))

    def add_weight_grads(self, grads: dict) -> None:
        """W, second: the replicated parts' new contributions summed over ``replica_group`` (scope this layer's,
        phase backward), then every part's added into its gradients."""
        if self.replica_group is not None:  # partial sums over this rank's share -> the whole gradient
            with self.group.tracer.region(scope=self.path, phase=BACKWARD):
                summed = self.replica_group.all_reduce(np.stack([grads[n][0] for n in self.replicated]))
            grads.update((n, (dw, grads[n][1])) for n, dw in zip(self.replicated, summed))
        for name, part in self.parts().items():
            part.add_grads(*grads.pop(name))

    def __repr__(self) -> str:
        return f"MultiOutputColumnParallelLinear({', '.join(self.names)}, tp={self.group.size})"
