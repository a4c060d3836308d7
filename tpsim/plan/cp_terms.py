"""Context parallelism's messages in the planner: their bytes, their link, and what the attention beside them hides.

**Bytes** are ``tpsim.predict.cp_comm``'s — every message the live implementation sends in one attention layer,
one rank, one micro-batch — at the layout's sizes: b rows of s tokens, the a/t query heads and g_t KV heads one
TP rank holds, d, e. Full recompute repeats the forward's messages in the backward (the recomputed attention
needs the other shards again), as it repeats the TP collectives. Per step: × the stage's layers × m.

**Link**: the CP group is tp·cp consecutive ranks in Megatron's order (TP fastest, then CP), so it is on the
node's link when tp·cp ≤ the GPUs of a node ("CP inside a node"), else across nodes ("CP across nodes"). Each
message costs α + β·bytes (across nodes on one NIC), a collective steps·α + wire bytes·β inside a node
(``tpsim.cost``) and NCCL's price across nodes (``tpsim.nccl``: the all-gather and reduce-scatter on the NICs of
the group's ranks in a node, Ulysses' all-to-all as grouped sends); a ring step is one send and one receive, on
the link's two directions at once.

**Exposed time** of one layer, charged to the F and B actions on the virtual clock beside their TP collectives
(t_kv: one K/V block's transfer; t_F, t_B: this rank's attention forward and backward kernels,
``tpsim.plan.kernels.attention``, whose cp blocks run one a step):

    ring       forward   cp − 1 steps, the next block arriving while this one is computed (TransformerEngine's
                         and Megatron's overlap): (cp − 1)·max(0, t_kv − t_F/cp)
               backward  cp − 1 steps carrying K/V and the travelling dK/dV, two messages beside one block each:
                         (cp − 1)·max(0, 2·t_kv − t_B/cp), then the last dK/dV home after the last block, t_kv
    allgather  the all-gather forward and the reduce-scatter backward, exposed whole: attention needs all of K, V
    ulysses    four all-to-alls each way, exposed whole: they feed the attention and take its output back

Under the contiguous layout the busiest rank's blocks set the pace (``tpsim.plan.cp_shape``): the larger t_F
hides more of each step. Pure arithmetic, no MPI.
"""

from __future__ import annotations

import numpy as np

from tpsim.phases import BACKWARD, FORWARD
from tpsim.plan.comm import links, ring_seconds
from tpsim.plan.cp_shape import busiest_share, kv_heads_per_rank
from tpsim.gpus import GPU
from tpsim.plan.kernel_time import seconds
from tpsim.plan.kernels import attention
from tpsim.plan.layout import Layout, rank_layers, virtual_stage_layers
from tpsim.plan.memory import ACT_BYTES
from tpsim.plan.models import ModelSpec
from tpsim.predict.cp_comm import cp_layer_bytes, cp_messages


def sizes(model: ModelSpec, lay: Layout) -> dict[str, int]:
    """``cp_messages``' sizes for one micro-batch on one GPU (the heads and KV heads of one TP rank)."""
    return {"b": lay.micro_batch, "s": lay.seq_len, "heads": model.heads // lay.tp,
            "kv_heads": kv_heads_per_rank(model, lay.tp), "head_dim": model.head_dim, "e": ACT_BYTES[lay.dtype]}


def layer_bytes(model: ModelSpec, lay: Layout) -> dict[str, int]:
    """``{"forward", "backward"}`` wire bytes one rank sends in one layer, one micro-batch (the backward with
    full recompute's repeated forward)."""
    out = cp_layer_bytes(lay.cp_comm, lay.cp, **sizes(model, lay))
    redo = out[FORWARD] if lay.recompute == "full" else 0
    return {"forward": out[FORWARD], "backward": out[BACKWARD] + redo}


def link_name(link) -> str:
    """The CP link in a few words: a node's link by its name; across nodes the NIC's, NCCL pricing the
    collectives (``tpsim.nccl.SpanningLink``)."""
    return f"{link.point.name}; NCCL's collectives" if hasattr(link, "collective") else link.name


def placement(lay: Layout) -> str:
    """Where the CP group sits (module docstring)."""
    if lay.cp == 1:
        return "no CP"
    return "CP inside a node" if lay.tp * lay.cp <= lay.gpus_per_node else "CP across nodes"


def _message_s(op: str, nbytes: int, cp: int, link) -> float:
    if op in ("send", "recv"):
        return link.alpha + link.beta * nbytes if op == "send" else 0.0
    return ring_seconds(op, nbytes, cp, link)


def layer_seconds(model: ModelSpec, lay: Layout, gpu: GPU) -> dict[str, dict[str, float]]:
    """``{"transfer": {"F", "B"}, "exposed": {"F", "B"}}`` seconds of one layer's CP messages for one
    micro-batch on one GPU: all of them, and what the attention beside them leaves (module docstring)."""
    zero = {"F": 0.0, "B": 0.0}
    if lay.cp == 1:
        return {"transfer": zero, "exposed": dict(zero)}
    link, cp = links(lay, gpu)["cp"], lay.cp
    msgs = cp_messages(lay.cp_comm, cp, **sizes(model, lay))
    transfer = {op: sum(calls * _message_s(kind, n, cp, link) for phase, kind, calls, n in msgs if phase == name)
                for op, name in (("F", FORWARD), ("B", BACKWARD))}
    if lay.cp_comm == "ring":
        block = {op: t / cp for op, t in seconds({"F": attention(model, lay, "F"),
                                                  "B": attention(model, lay, "B")}, lay, gpu).items()}
        kv = _message_s("send", msgs[0][3], cp, link)
        exposed = {"F": (cp - 1) * max(0.0, kv - block["F"]),
                   "B": (cp - 1) * max(0.0, 2 * kv - block["B"]) + kv}
    else:
        exposed = dict(transfer)
    if lay.recompute == "full":  # the recomputed forward fetches the other shards again, inside B
        transfer["B"] += transfer["F"]
        exposed["B"] += exposed["F"]
    return {"transfer": transfer, "exposed": exposed}


def stage_cp(model: ModelSpec, lay: Layout, gpu: GPU) -> np.ndarray:
    """Exposed CP seconds of one micro-batch's F, B and W on one GPU, ``[rank][chunk][op]`` (W: none): each
    virtual stage's layers × one layer's."""
    per = layer_seconds(model, lay, gpu)["exposed"]
    layers = virtual_stage_layers(model, lay)
    out = np.zeros((lay.pp, lay.vp, 3))
    for r in range(lay.pp):
        for c in range(lay.vp):
            out[r, c] = (layers[c * lay.pp + r] * per["F"], layers[c * lay.pp + r] * per["B"], 0.0)
    return out


def cp_terms(model: ModelSpec, lay: Layout, gpu: GPU, stage: int, exposed_s: float) -> dict:
    """What ``tpsim plan --json`` prints as ``cp`` for one GPU of ``stage``; ``exposed_s``: the step's ``cp``
    part (``tpsim.plan.timing``)."""
    per = layer_bytes(model, lay)
    t = layer_seconds(model, lay, gpu)
    per_step = rank_layers(model, lay)[stage] * lay.microbatches * (per["forward"] + per["backward"])
    return {"cp": lay.cp, "comm": lay.cp_comm, "layout": lay.cp_layout, "placement": placement(lay),
            "link": link_name(links(lay, gpu)["cp"]) if lay.cp > 1 else None,
            "busiest_share": busiest_share(lay), "bytes_per_layer_per_microbatch": per,
            "wire_bytes_per_step": per_step, "transfer_s_per_layer": t["transfer"],
            "exposed_s_per_layer": t["exposed"], "exposed_s_per_step": exposed_s}

