"""Exercise 16's classic slips, fed to ``tpsim check 16``: each gets its own symptom sentence, never the answer.

As in ``test_exercise_diagnoses.py``: the reference solution with one function redefined, checked like a
learner's file. The model-state slips are the ZeRO paper's 2 + 2 + 12 (the 2-byte gradients of a bf16 run), fp16
without Megatron's fp32 main-gradient buffer, and an answer in GiB or GB; the activation slips are Table 2
multiplied by 2 bytes again (it is already in bytes), the attention scores kept under selective recompute, and
full recompute not divided by t under SP. A number near zero must not pass for "in GiB".
"""

from __future__ import annotations

import textwrap

import pytest

from tpsim.cli import main as tpsim_main
from tpsim.teach.checks import CHECKS
from tpsim.teach.lessons import exercise_files

pytestmark = pytest.mark.slow

SOLUTION = exercise_files("solutions")["16"]

MISTAKES = {
    "zero_paper_bytes_everywhere": ("""
        BYTES_PER_PARAM = {"bf16": (2, 2, 12), "fp16": (2, 2, 12), "fp32": (4, 4, 8)}
        """, "2-byte gradients (the ZeRO paper's 2 + 2 + 12)"),
    "fp16_with_16_bit_gradients": ("""
        BYTES_PER_PARAM = {"bf16": (2, 4, 12), "fp16": (2, 2, 12), "fp32": (4, 4, 8)}
        """, "an fp16 run accumulates its gradients in fp32"),
    "fp16_as_the_tables_row": ("""
        BYTES_PER_PARAM = {"bf16": (2, 4, 12), "fp16": (2, 2, 16), "fp32": (4, 4, 8)}
        """, "dist_optimizer.md's fp16 row (2 + 2 + 16)"),
    "state_in_gib": ("""
        _right = model_state_bytes_per_gpu
        def model_state_bytes_per_gpu(params, dtype, zero, dp):
            return _right(params, dtype, zero, dp) / 2 ** 30
        """, "your number is in GiB (bytes ÷ 2³⁰)"),
    "state_in_gb": ("""
        _right = model_state_bytes_per_gpu
        def model_state_bytes_per_gpu(params, dtype, zero, dp):
            return _right(params, dtype, zero, dp) / 1e9
        """, "your number is in GB (bytes ÷ 10⁹)"),
    "table_2_times_2_bytes": ("""
        _right = gpt_layer_activation_bytes
        def gpt_layer_activation_bytes(s, b, h, a, t, sp, recompute):
            return 2 * _right(s, b, h, a, t, sp, recompute)
        """, "twice the bytes: Table 2 is already in bytes"),
    "selective_keeps_the_scores": ("""
        _right = gpt_layer_activation_bytes
        def gpt_layer_activation_bytes(s, b, h, a, t, sp, recompute):
            return _right(s, b, h, a, t, sp, "none" if recompute == "selective" else recompute)
        """, "selective recompute kept the attention scores"),
    "full_recompute_whole_under_sp": ("""
        _right = gpt_layer_activation_bytes
        def gpt_layer_activation_bytes(s, b, h, a, t, sp, recompute):
            out = _right(s, b, h, a, t, sp, recompute)
            return out * t if recompute == "full" and sp else out
        """, "full recompute under SP kept the whole input"),
}


def check_16(capfd, tmp_path, monkeypatch, override: str) -> tuple[int, str]:
    monkeypatch.chdir(tmp_path)  # no hint state of another test
    path = tmp_path / "ex16_mine.py"
    path.write_text(SOLUTION.read_text() + "\n\n# --- the mistake ---\n" + textwrap.dedent(override))
    capfd.readouterr()
    code = tpsim_main(["check", "16", str(path)])
    out, err = capfd.readouterr()
    return code, out + err


@pytest.mark.parametrize("case", sorted(MISTAKES))
def test_each_slip_is_named_and_the_answer_is_not_given(capfd, tmp_path, monkeypatch, case):
    override, sentence = MISTAKES[case]
    code, out = check_16(capfd, tmp_path, monkeypatch, override)
    assert code == 1, out
    assert "exercise 16 FAILED" in out and sentence in out, out
    assert "Traceback" not in out, out
    assert not any(level in out for levels in CHECKS["16"].hints.values() for level in levels), out
    assert "expected " not in out.replace("expected shape", ""), out


def test_a_number_near_zero_is_not_taken_for_an_answer_in_gib(capfd, tmp_path, monkeypatch):
    code, out = check_16(capfd, tmp_path, monkeypatch, """
        def model_state_bytes_per_gpu(params, dtype, zero, dp):
            return 0.5
        """)
    assert code == 1 and "too small" in out, out
    assert "GiB" not in out and "GB (" not in out, out
