"""Exercises 14 (ZeRO-1's owned slices) and 15 (bfloat16 rounding, the loss scaler): each classic slip, fed to
``tpsim check``, is named by what the result looks like, and the answer is not printed.

As in ``test_exercise_diagnoses.py``: the reference solution with one function redefined is written to a temporary
file and checked on real ranks like a learner's file. The test asserts the symptom sentence of that slip appears
(the check's own constant, so a reworded sentence cannot pass silently), that no hint is printed unasked, and
that no expected value is.
"""

from __future__ import annotations

import textwrap

import numpy as np
import pytest

from tpsim.cli import main as tpsim_main
from tpsim.nn.precision import bfloat16
from tpsim.teach.checks import CHECKS, lesson_14 as ex14, lesson_15 as ex15
from tpsim.teach.lessons import exercise_files

pytestmark = pytest.mark.slow

SOLUTIONS = exercise_files("solutions")

# (exercise, the redefined function, the sentence the diagnosis must contain)
SLIPS = {
    "array_split_slices": ("14", """
        import numpy as np
        def owned_range(n, dp, rank):
            parts = np.array_split(np.arange(n), dp)
            start = sum(len(p) for p in parts[:rank])
            return start, start + len(parts[rank])
        """, ex14.ARRAY_SPLIT),
    "last_range_clipped_at_n": ("14", """
        def owned_range(n, dp, rank):
            shard = -(-n // dp)
            return rank * shard, min((rank + 1) * shard, n)
        """, ex14.CLIPPED),
    "inclusive_stop": ("14", """
        def owned_range(n, dp, rank):
            shard = -(-n // dp)
            return rank * shard, (rank + 1) * shard - 1
        """, ex14.INCLUSIVE),
    "shard_one_too_long": ("14", """
        def owned_range(n, dp, rank):
            shard = n // dp + 1
            return rank * shard, (rank + 1) * shard
        """, ex14.SHARD_PLUS_ONE),
    "remainder_to_the_last_rank": ("14", """
        def owned_range(n, dp, rank):
            shard = n // dp
            return rank * shard, n if rank == dp - 1 else (rank + 1) * shard
        """, ex14.NO_PADDING),  # rank 0's slice shows it first: n // dp long
    "pieces_with_inclusive_stops": ("14", """
        def owned_pieces(sizes, dp, rank):
            lo, hi = owned_range(sum(sizes), dp, rank)
            pieces, offset = [], 0
            for i, size in enumerate(sizes):
                start, stop = max(lo, offset), min(hi, offset + size)
                if start < stop:
                    pieces.append((i, start - offset, stop - offset - 1))
                offset += size
            return pieces
        """, ex14.PIECES_INCLUSIVE),
    "empty_pieces_kept": ("14", """
        def owned_pieces(sizes, dp, rank):
            lo, hi = owned_range(sum(sizes), dp, rank)
            pieces, offset = [], 0
            for i, size in enumerate(sizes):
                pieces.append((i, max(lo, offset) - offset, min(hi, offset + size) - offset))
                offset += size
            return pieces
        """, ex14.EMPTY_PIECES),
    "bf16_saturates_instead_of_inf": ("15", """
        def bfloat16_bits(x):
            bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
            out = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
            return np.where((out & 0x7FFF) == 0x7F80, out - 1, out).astype(np.uint16)
        """, ex15.SATURATED),
    "bf16_flushes_subnormals": ("15", """
        def bfloat16_bits(x):
            bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
            out = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
            return np.where((bits & 0x7F800000) == 0, (bits >> 16) & 0x8000, out).astype(np.uint16)
        """, ex15.FLUSHED),
    "bf16_parity_from_bit_15": ("15", """
        def bfloat16_bits(x):
            bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
            return ((bits + 0x7FFF + ((bits >> 15) & 1)) >> 16).astype(np.uint16)
        """, ex15.HALF_UP),
    "growth_one_step_late": ("15", """
        def update_loss_scale(scale, good_steps, found_inf, growth_interval, growth=2.0, backoff=0.5, min_scale=1.0):
            if found_inf:
                return max(scale * backoff, min_scale), 0, True
            good_steps += 1
            if good_steps > growth_interval:
                return scale * growth, 0, False
            return scale, good_steps, False
        """, ex15.LATE),
    "growth_counted_before_the_step": ("15", """
        def update_loss_scale(scale, good_steps, found_inf, growth_interval, growth=2.0, backoff=0.5, min_scale=1.0):
            if found_inf:
                return max(scale * backoff, min_scale), 0, True
            if good_steps == growth_interval:
                return scale * growth, 0, False
            return scale, good_steps + 1, False
        """, ex15.LATE),
    "growth_one_step_early": ("15", """
        def update_loss_scale(scale, good_steps, found_inf, growth_interval, growth=2.0, backoff=0.5, min_scale=1.0):
            if found_inf:
                return max(scale * backoff, min_scale), 0, True
            good_steps += 1
            if good_steps >= growth_interval - 1:
                return scale * growth, 0, False
            return scale, good_steps, False
        """, ex15.EARLY),
    "no_floor_on_the_scale": ("15", """
        def update_loss_scale(scale, good_steps, found_inf, growth_interval, growth=2.0, backoff=0.5, min_scale=1.0):
            if found_inf:
                return scale * backoff, 0, True
            good_steps += 1
            if good_steps == growth_interval:
                return scale * growth, 0, False
            return scale, good_steps, False
        """, ex15.NO_FLOOR),
    "overflow_not_skipped": ("15", """
        def update_loss_scale(scale, good_steps, found_inf, growth_interval, growth=2.0, backoff=0.5, min_scale=1.0):
            if found_inf:
                return max(scale * backoff, min_scale), 0, False
            good_steps += 1
            if good_steps == growth_interval:
                return scale * growth, 0, False
            return scale, good_steps, False
        """, ex15.NO_SKIP),
}


def tpsim(capfd, *args: str) -> tuple[int, str]:
    capfd.readouterr()
    code = tpsim_main(list(args))
    out, err = capfd.readouterr()
    return code, out + err


def wrong_file(tmp_path, number: str, override: str):
    path = tmp_path / f"ex{number}_mine.py"
    path.write_text(SOLUTIONS[number].read_text() + "\n\n# --- the slip ---\n" + textwrap.dedent(override))
    return path


@pytest.mark.parametrize("case", sorted(SLIPS))
def test_each_slip_is_named_and_the_answer_is_not_printed(capfd, tmp_path, monkeypatch, case):
    number, override, sentence = SLIPS[case]
    monkeypatch.chdir(tmp_path)  # no hint state of another test
    code, out = tpsim(capfd, "check", number, str(wrong_file(tmp_path, number, override)))
    assert code == 1, out
    assert f"exercise {number} FAILED" in out and sentence in out, out
    assert "--hint reveals" in out, out
    hints = [level for levels in CHECKS[number].hints.values() for level in levels]
    assert not any(text in out for text in hints), out
    assert "expected " not in out.replace("expected shape", ""), out


def test_a_uint32_bfloat16_answer_passes(capfd, tmp_path, monkeypatch):
    """Hint 3 says uint32 is enough for finite inputs: the reference answer works in uint32 and passes, inputs
    that round to ±inf included."""
    monkeypatch.chdir(tmp_path)
    assert "np.uint64" not in SOLUTIONS["15"].read_text()
    code, out = tpsim(capfd, "check", "15", str(SOLUTIONS["15"]))
    assert code == 0 and "exercise 15 OK" in out, out


def test_the_edge_cases_are_in_the_inputs():
    """ex14: buckets whose length is not a multiple of dp, and shorter than dp; ex15: subnormals, values that
    round to ±inf, and the scaler one clean step before and at the growth step."""
    assert any(n % dp and n > dp for n, dp in ex14.RANGE_CASES) and any(0 < n < dp for n, dp in ex14.RANGE_CASES)
    assert any(sum(sizes) % dp for sizes, dp in ex14.PIECE_CASES)
    x = ex15._inputs()
    bits = x.view(np.uint32)
    assert (((bits & 0x7F800000) == 0) & ((bits & 0x007FFFFF) != 0)).sum() >= 4, "subnormal inputs"
    assert np.isfinite(x).all() and np.isinf(x.astype(bfloat16).astype(np.float32)).sum() >= 3, "rounding to inf"
    steps = {(good + 1 - interval) for inf, _, good, interval in ex15.SCALER_CASES if not inf}
    assert {-1, 0} <= steps, "clean steps just before and at the growth step"
