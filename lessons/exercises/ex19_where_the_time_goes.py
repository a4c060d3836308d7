"""Exercise 19 — the DP gradient sync of an overlapped backward: how much of it is exposed, and when it hides
(lesson 19_where_the_time_goes.py).

Both functions are arithmetic: no collective, no group. The backward produces the gradients of bucket k by time
``ready[k]`` (seconds, in bucket order); bucket k's all-reduce lasts ``durations[k]`` seconds on a communication
stream that runs the buckets one after the other, in order, beside the compute; the backward's last kernel ends
at ``compute_end``. The check compares both with the reference on many bucket schedules — one bucket, buckets
that queue, buckets ready at the very end, schedules that hide exactly — then holds ``exposed_dp_seconds`` to the
DP sync of a live PP 2 × DP 2 step on the virtual clock, where nothing overlaps.
Check it:   tpsim check 19           (4 ranks)
The reference answer: tpsim lesson solution 19 (prints where it is) — try first.
"""

from __future__ import annotations


def exposed_dp_seconds(ready: list[float], durations: list[float], compute_end: float) -> float:
    """Seconds of the DP all-reduces that run past ``compute_end``: what the step still waits for after the
    backward (lesson 19, "Exposed communication, and when it hides")."""
    # TODO: when can bucket k's all-reduce start on an in-order stream, and when does the stream end?
    raise NotImplementedError


def hides_fully(ready: list[float], durations: list[float], compute_end: float) -> bool:
    """True when the communication stream is done by ``compute_end``, decided by the Ultra-Scale Playbook's
    inequality t_compute_backward ≥ t_comm read bucket by bucket (do not simulate the stream here)."""
    # TODO: which compute must cover which all-reduces, for every bucket?
    raise NotImplementedError
