"""The live virtual clock of real pipeline ranks against the reference for time (``tests/reference_clock.py``).

One traced step of the toy GPT-2 (tied embedding) and Llama on PP 2 × DP 2 (× TP 2 at 8 ranks) under the H100
clock, DP buckets cut small so that each rank has several (a layer in more than one, a bucket over several
layers), with the DP sync plain, overlapped (``--overlap-grad-reduce``), and under ZeRO-1 with both overlaps. The
reference is given the planner's seconds of each piece, message and collective (which the live clock is held to
elsewhere, ``test_pipeline_collective_clock.py``) and this run's own buckets — the pieces each one's parameters
sit in, read from the shard — and must place every action, receive, collective after the schedule and DP bucket
where the live clock placed it, and end the step where it ended it (1e-12 relative).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the reference lives beside the one-process tests
from conftest import WORLD  # noqa: E402
from reference_clock import invariants, simulate as reference  # noqa: E402
from test_pipeline_parallel import assert_everywhere  # noqa: E402
from time_cases import planner_step  # noqa: E402
from time_invariants import clock_problems  # noqa: E402
from tpsim.comm import ProcessGrid  # noqa: E402
from tpsim.gpus import gpu  # noqa: E402
from tpsim.plan.live_pipeline import one_step, pipeline_run  # noqa: E402
from tpsim.plan.of_run import model_spec, run_layout  # noqa: E402
from tpsim.live_pipeline.buckets import bucket_specs, parameter_pieces  # noqa: E402

N = WORLD.Get_size()
TP = 2 if N == 8 else 1
# (arch, schedule, vp, micro-batches, ZeRO, overlap, bucket cap in MiB)
CASES = [("gpt2", "1f1b", 1, 4, 0, "", 0.002), ("gpt2", "1f1b", 1, 3, 0, "grad", 0.002),
         ("llama", "1f1b", 1, 4, 1, "both", 0.04), ("gpt2", "interleaved", 2, 4, 0, "grad", 0.004),
         ("gpt2", "afab", 1, 2, 1, "both", 0.001)]
_GRID: dict = {}
RELATIVE = 1e-12


def close(a: float, b: float) -> bool:
    return abs(a - b) <= RELATIVE * max(abs(a), abs(b))


def same(got: list[tuple], want: list[tuple]) -> bool:
    return len(got) == len(want) and all(g[:3] == w[:3] and close(g[3], w[3]) and close(g[4], w[4])
                                         for g, w in zip(got, want))


@pytest.mark.skipif(N not in (4, 8), reason="PP 2 x DP 2 (x TP 2) needs 4 or 8 ranks")
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[1]}-zero{c[4]}-{c[5] or 'plain'}")
def test_the_live_clock_places_every_span_where_the_reference_does(case):
    arch, schedule, vp, m, zero, overlap, cap = case
    run = pipeline_run(TP, 2, 2, schedule, vp, m, 2 * vp * 2, "h100-80gb", False, arch, zero=zero,
                       overlap=overlap, bucket_mb=cap)
    grid = _GRID.setdefault("grid", ProcessGrid(tp=TP, dp=2, pp=2))
    result, shard, sync = one_step(run, grid)
    where = parameter_pieces(shard)
    mine = [(spec, tuple(dict.fromkeys(where[n][:2] for n in bucket.names)))
            for spec, bucket in zip(bucket_specs(shard, sync, held=True), sync.buckets)]
    everyone = grid.pp_group.comm.allgather(mine)  # after the step: bookkeeping, not traffic of the step
    model, lay = model_spec(run.model), run_layout(run)
    step = planner_step(model, lay, gpu(lay.gpu), everyone)
    ref = reference(step)
    problems = invariants(ref, step)
    assert_everywhere(not problems, f"the reference breaks its own rules: {problems[:2]}")
    r, clock = grid.pp_rank, result.clock
    broken = clock_problems(clock)
    assert_everywhere(not broken, f"the live clock's spans break a rule: {broken[:2]}")
    assert_everywhere(len(mine) > 1 and any(len(w) > 1 for _, w in mine),
                      f"{len(mine)} buckets, each in one piece: too few to test")
    got = [(s.op, s.microbatch, s.chunk if s.microbatch >= 0 else -1, s.start, s.end) for s in clock.spans
           if s.op not in ("loss normalizer", "DP sync", "DP exposed", "param all-gather")]
    assert_everywhere(same(got, ref.compute[r]), f"live spans {got[:4]}… vs the reference's {ref.compute[r][:4]}…")
    comm = [(f"reduce {s.op.split()[-1]}", -1, -1, s.start, s.end) for s in clock.comm_spans()]
    want = [s for s in ref.comm[r] if s.kind.startswith("reduce")]
    assert_everywhere(same(comm, want), f"live DP buckets {comm} vs the reference's {want}")
    assert_everywhere(close(clock.time, ref.end[r]), f"step end {clock.time} vs the reference's {ref.end[r]}")
    assert_everywhere(abs(clock.gather_exposed - ref.gather_exposed[r]) <= RELATIVE * ref.step,
                      f"exposed all-gather {clock.gather_exposed} vs {ref.gather_exposed[r]}")
