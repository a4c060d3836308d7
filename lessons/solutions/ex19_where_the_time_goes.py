"""Reference answer to exercise 19 — the exposed DP sync of an overlapped backward, and when it hides fully
(lesson 19_where_the_time_goes.py)."""

from __future__ import annotations


def exposed_dp_seconds(ready: list[float], durations: list[float], compute_end: float) -> float:
    end = float("-inf")
    for r, d in zip(ready, durations):  # in order: a bucket waits for its gradients and for the one before it
        end = max(r, end) + d
    return max(0.0, end - compute_end)  # what ends under the compute costs nothing


def hides_fully(ready: list[float], durations: list[float], compute_end: float) -> bool:
    # the stream ends at max_k (r_k + d_k + ... + d_last): every bucket's compute left must cover its queue
    return all(compute_end - ready[k] >= sum(durations[k:]) for k in range(len(ready)))
