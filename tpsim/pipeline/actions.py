"""The vocabulary of a pipeline schedule: each pipeline rank's list of actions, in the order it performs them.

A model of L layers cut into ``pp × vp`` pieces (*virtual stages*) runs on ``pp`` ranks of a pipeline group;
rank r holds model chunks c = 0 .. vp − 1, chunk c being virtual stage ``c·pp + r`` (Megatron-LM's interleaved
layout; vp = 1 is the plain pipeline, virtual stage = rank). A step's global batch is cut into ``microbatches``
micro-batches. One rank's list says, for every micro-batch and chunk, when it

    F        runs the chunk's forward (its input: the embedding on virtual stage 0, else the RECV_F before it)
    B        runs the chunk's backward; in a zero-bubble schedule only its input-gradient half (dX)
    W        runs the weight-gradient half of the backward (dW), split off B (zero-bubble schedules only)
    SEND_F   sends the chunk's output activation to the next virtual stage's rank (``peer``)
    RECV_F   receives this chunk's input activation from the previous virtual stage's rank
    SEND_B   sends the gradient of the chunk's input to the previous virtual stage's rank
    RECV_B   receives the gradient of the chunk's output from the next virtual stage's rank

and, when the pass of ``tpsim.pipeline.collectives`` has inserted data parallelism's collectives (over the
gradient group, not the pipeline: PyTorch's ``UNSHARD``, ``RESHARD`` and ``REDUCE_GRAD`` are the anchor),

    UNSHARD      the chunk's parameters made whole for the F or B right after it
    RESHARD      the chunk's gathered parameters freed after the F or B right before it
    REDUCE_GRAD  the gradients the backward before it (B, or W when split) finished, reduced over the group

Semantics every consumer shares (the live executor, the checker, the virtual clock): a SEND is posted and does
not wait (a non-blocking send completed by the end of the step); a RECV waits until its message has been sent;
a collective waits for no other pipeline rank (every replica of the stage runs the same list).
A message is named by (direction, micro-batch, virtual stage of its sender), so it matches exactly one RECV.
Pure data, MPI-free.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

COMPUTE = ("F", "B", "W")
SENDS = {"SEND_F": "RECV_F", "SEND_B": "RECV_B"}
RECVS = {recv: send for send, recv in SENDS.items()}
COLLECTIVES = ("UNSHARD", "RESHARD", "REDUCE_GRAD")
LOCAL = (*COMPUTE, *COLLECTIVES)  # actions that name no peer and wait for no other pipeline rank
OPS = (*COMPUTE, *SENDS, *RECVS, *COLLECTIVES)


@dataclass(frozen=True)
class Action:
    """One action of one pipeline rank: ``op`` on micro-batch ``microbatch`` of model chunk ``chunk``;
    ``peer`` is the other pipeline rank of a send or receive (None for compute and collectives)."""

    op: str
    microbatch: int
    chunk: int = 0
    peer: int | None = None

    def __post_init__(self) -> None:
        if self.op not in OPS:
            raise ValueError(f"unknown pipeline action {self.op!r} (one of {', '.join(OPS)})")
        if (self.peer is None) != (self.op in LOCAL):
            raise ValueError(f"{self.op}: a send or receive names its peer, a compute action or a collective none")

    def __str__(self) -> str:
        chunk = f".{self.chunk}" if self.chunk else ""
        peer = f"→{self.peer}" if self.op in SENDS else f"←{self.peer}" if self.op in RECVS else ""
        return f"{self.op}{self.microbatch}{chunk}{peer}"


@dataclass(frozen=True)
class Schedule:
    """Every pipeline rank's action list: ``ranks[r]`` is rank r's, in order."""

    name: str
    pp: int
    microbatches: int
    vp: int
    ranks: tuple[tuple[Action, ...], ...]

    def virtual_stage(self, rank: int, chunk: int) -> int:
        """Model chunk ``chunk`` of pipeline rank ``rank`` is this piece of the model (0 holds the embedding)."""
        return chunk * self.pp + rank

    def place(self, virtual_stage: int) -> tuple[int, int]:
        """``(rank, chunk)`` holding a virtual stage."""
        return virtual_stage % self.pp, virtual_stage // self.pp

    @property
    def stages(self) -> int:
        """The number of virtual stages, pp × vp."""
        return self.pp * self.vp

    @cached_property
    def has_collectives(self) -> bool:
        """Whether the lists carry data parallelism's collectives (``tpsim.pipeline.collectives``)."""
        return any(a.op in COLLECTIVES for actions in self.ranks for a in actions)

    @cached_property  # the checker asks per chunk: one scan of the lists, not one a question
    def splits_backward(self) -> bool:
        """Whether backward is split into B (input gradient) and W (weight gradient), as zero-bubble schedules do."""
        return any(a.op == "W" for actions in self.ranks for a in actions)

    def message(self, rank: int, action: Action) -> tuple[str, int, int]:
        """The message a send or receive of ``rank`` moves: (direction "F" or "B", micro-batch, the virtual stage
        of its sender) — a send and the receive it pairs with name the same one."""
        stage = action.chunk * self.pp + rank
        op = action.op
        sender = stage if op in SENDS else stage - 1 if op == "RECV_F" else stage + 1
        return op[-1], action.microbatch, sender


def with_messages(pp: int, vp: int, rank: int, compute: list[tuple[str, int, int]]) -> tuple[Action, ...]:
    """A rank's compute order ``[(op, microbatch, chunk), ...]`` with the sends and receives it implies: a RECV
    just before the F or B that needs it, a SEND just after the F or B that produced it (none at the ends of the
    model: virtual stage 0 receives no activation, the last sends none; W moves nothing)."""
    last = pp * vp - 1
    out: list[Action] = []
    for op, j, c in compute:
        stage = c * pp + rank
        if op == "F" and stage > 0:
            out.append(Action("RECV_F", j, c, (stage - 1) % pp))
        if op == "B" and stage < last:
            out.append(Action("RECV_B", j, c, (stage + 1) % pp))
        out.append(Action(op, j, c))
        if op == "F" and stage < last:
            out.append(Action("SEND_F", j, c, (stage + 1) % pp))
        if op == "B" and stage > 0:
            out.append(Action("SEND_B", j, c, (stage - 1) % pp))
    return tuple(out)
