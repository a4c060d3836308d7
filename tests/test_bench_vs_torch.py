"""bench/bench_vs_torch.py's pure parts — FLOP counts, the GEMM limit, the JSON schema — and one small run.

The arithmetic runs without torch or MPI; the whole-program test (slow) needs torch and is skipped without it.
The numbers in the FLOP tests are worked out by hand from the shapes in the docstrings of bench/gemm_limit.py.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest

from launch_program import ROOT, run_mpi

sys.path.insert(0, str(ROOT / "bench"))
from gemm_limit import (Gemm, attention_core_gemms, block_gemms, gemm_limit_seconds, gpt_gemms,  # noqa: E402
                        linear_gemms, mlp_gemms, ranks_per_core, total_flops)
from result_json import SCHEMA, case_ratios, stats, validate  # noqa: E402


def test_a_linear_costs_three_gemms_of_2_t_in_out_flops_each():
    gemms = linear_gemms(tokens=5, fan_in=3, fan_out=7)
    assert gemms == [Gemm(5, 3, 7), Gemm(3, 5, 7), Gemm(5, 7, 3)]  # y = x·W, dW = xᵀ·dy, dx = dy·Wᵀ
    assert [g.flops for g in gemms] == [210, 210, 210]
    assert Gemm(2, 3, 4, batch=5).flops == 2 * 2 * 3 * 4 * 5


def test_the_issues_mlp_is_48_t_h_squared_over_tp_flops_per_rank():
    # 2 linears x 3 GEMMs x 2·T·h·(4h/p) = 48·T·h²/p: 25.8 GFLOP per rank for T 2048, h 1024, TP 4
    assert total_flops(mlp_gemms(2048, 1024, 4096, 4)) == 48 * 2048 * 1024**2 // 4 == 25_769_803_776
    assert total_flops(mlp_gemms(2048, 1024, 4096, 1)) == 4 * total_flops(mlp_gemms(2048, 1024, 4096, 4))


def test_attention_core_counts_six_s_by_s_products_per_local_head():
    b, nh, s, hd = 2, 3, 5, 7
    assert total_flops(attention_core_gemms(b, nh, s, hd)) == 6 * 2 * s * s * hd * b * nh


def test_block_and_gpt_add_up_their_layers():
    b, s, h, heads, tp = 2, 8, 16, 4, 2
    T = b * s
    qkv_and_proj = 3 * 2 * T * h * (3 * h // tp) + 3 * 2 * T * (h // tp) * h
    core = 6 * 2 * s * s * (h // heads) * b * (heads // tp)
    mlp = 48 * T * h * h // tp
    assert total_flops(block_gemms(b, s, h, heads, tp)) == qkv_and_proj + core + mlp
    head = 3 * 2 * T * h * (32 // tp)  # tied LM head: x·wteᵀ, its dx and its dW
    assert total_flops(gpt_gemms(b, s, h, heads, 3, 32, tp)) == 3 * (qkv_and_proj + core + mlp) + head


def test_the_gemm_limit_counts_ranks_per_core_but_never_less_than_one():
    assert ranks_per_core(8, 2) == 4.0 and ranks_per_core(4, 2) == 2.0 and ranks_per_core(2, 16) == 1.0
    # 2 GFLOP per rank at 1 GFLOP/s is 2 s alone; 8 ranks on 2 cores take 4 x that
    assert gemm_limit_seconds(2e9, 1e9, ranks=8, cores=2) == pytest.approx(8.0)
    assert gemm_limit_seconds(2e9, 1e9, ranks=2, cores=16) == pytest.approx(2.0)
    for bad in ((1e9, 0.0, 4, 2), (1e9, 1e9, 0, 2), (1e9, 1e9, 4, 0)):
        with pytest.raises(ValueError):
            gemm_limit_seconds(*bad)


def valid_doc() -> dict:
    tpsim, torch = stats([0.7, 0.6, 0.65]), stats([0.8, 0.75, 0.9])
    case = {"description": "MLP", "shape": {"hidden": 8}, "dtype": "float32", "tp": 4, "dp": 1, "ranks": 4,
            "seconds": {"tpsim": tpsim, "torch": torch},
            "gemm": {"flops_per_rank": 10, "rate_flops_per_s": 20.0, "limit_s": {"median": 0.5, "best": 0.4}},
            "ratios": case_ratios(tpsim, torch, {"gemm_limit": {"median": 0.5, "best": 0.4},
                                                 "gemm_concurrent": {"median": 0.6, "best": 0.5}}),
            "check": {"max_rel_diff": 1e-7, "tolerance": 1e-4, "ok": True}}
    return {"schema": SCHEMA, "command": "mpirun -n 4 python bench/bench_vs_torch.py",
            "machine": dict.fromkeys(("hostname", "cpu", "cores", "python", "numpy", "torch", "mpi"), "x"),
            "settings": dict.fromkeys(("ranks", "repeats", "warmup", "threads_per_rank", "statistics", "note"), 1),
            "cases": {"mlp": case}}


def test_stats_and_ratios_divide_median_by_median_and_best_by_best():
    s = stats([3.0, 1.0, 2.0])
    assert s == {"median": 2.0, "best": 1.0, "all": [3.0, 1.0, 2.0]}
    r = case_ratios(s, stats([4.0, 2.0, 8.0]), {"gemm_limit": {"median": 0.5, "best": 0.25},
                                                "gemm_concurrent": {"median": 1.0, "best": 0.5}})
    assert r["tpsim/torch"] == {"median": 0.5, "best": 0.5}
    assert r["tpsim/gemm_limit"] == {"median": 4.0, "best": 4.0}
    assert r["torch/gemm_limit"] == {"median": 8.0, "best": 8.0}
    assert r["tpsim/gemm_concurrent"] == {"median": 2.0, "best": 2.0}
    assert r["torch/gemm_concurrent"] == {"median": 4.0, "best": 4.0}
    with pytest.raises(ValueError):
        stats([])


def test_validate_accepts_the_schema_and_names_each_departure():
    assert validate(valid_doc()) == []
    doc = valid_doc()
    del doc["machine"]["cpu"]
    doc["cases"]["mlp"]["seconds"]["torch"]["best"] = 0.99  # not the minimum of "all", above the median
    del doc["cases"]["mlp"]["ratios"]["tpsim/gemm_limit"]
    doc["cases"]["mlp"]["check"]["ok"] = "yes"
    doc["cases"]["mlp"]["gemm"]["limit_s"] = 0.5  # one number: the limit has a median and a best
    problems = validate(doc)
    assert any("machine lacks 'cpu'" in p for p in problems)
    assert any("seconds.torch best/median/all are inconsistent" in p for p in problems)
    assert any("ratios lacks 'tpsim/gemm_limit'" in p for p in problems)
    assert any("check.ok" in p for p in problems)
    assert any("gemm.limit_s needs median and best" in p for p in problems)
    missing = copy.deepcopy(valid_doc())
    del missing["cases"]
    assert validate(missing) == ["missing top-level key 'cases'"]


def test_tpsim_itself_never_imports_torch():
    offenders = [str(p.relative_to(ROOT)) for p in (ROOT / "tpsim").rglob("*.py")
                 if any(line.strip().startswith(("import torch", "from torch"))
                        for line in p.read_text().splitlines())]
    assert offenders == [], f"tpsim must not depend on torch: {offenders}"


def test_without_torch_the_benchmark_says_so_and_exits_0():
    code = ("import sys; sys.modules['torch'] = None; sys.path.insert(0, 'bench'); "
            "import bench_vs_torch; sys.exit(bench_vs_torch.main([]))")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "PyTorch is not installed" in r.stdout and "skipped" in r.stdout


@pytest.mark.slow
def test_a_small_run_checks_all_three_cases_and_writes_valid_json(tmp_path: Path):
    pytest.importorskip("torch")
    out = tmp_path / "bench.json"
    r = run_mpi(8, ["bench/bench_vs_torch.py", "--hidden", "64", "--tokens", "64", "--heads", "4", "--batch", "2",
                    "--seq", "16", "--repeats", "2", "--demo-repeats", "2", "--warmup", "0", "--json", str(out)],
                timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads(out.read_text())
    assert validate(doc) == []
    assert sorted(doc["cases"]) == ["block", "demo", "mlp"]
    for name, case in doc["cases"].items():
        assert case["check"]["ok"], (name, case["check"])
        assert len(case["seconds"]["tpsim"]["all"]) == 2
        assert case["ratios"]["tpsim/gemm_limit"]["median"] > 0
        assert len(case["gemm"]["seconds_per_rank"]["all"]) == 2
        assert case["gemm"]["concurrent_s"]["median"] > 0
    assert doc["cases"]["demo"]["dtype"] == "float64" and doc["cases"]["demo"]["ranks"] == 8
    assert "check: max relative difference" in r.stdout and "GEMM limit" in r.stdout
