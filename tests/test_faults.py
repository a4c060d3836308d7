"""The fault suite: whole programs under mpiexec, each ending with its documented message and status, fast.

Exit statuses (docs/guide/failing-well.md): 0 ok, 1 a check failed or training stopped, 2 bad configuration or
input (one line on rank 0, nothing computed), anything else = aborted (a crashed rank, a signal: 128 + its
number). Faults are planted by ``tests/programs/demo_with_fault.py`` in a tiny demo at 2 ranks; "within 10 s"
is measured from the moment of the fault (the program prints it) or of the signal, not from the launch.
Every test launches its own job, by design: each fault ends the job it is planted in.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from launch_program import ROOT, run_mpi
from tpsim.errors import ABORTED
from tpsim.launcher import mpiexec
from tpsim.npzfile import write_npz

pytestmark = pytest.mark.slow

TINY = ["--layers", "2", "--hidden", "16", "--heads", "2", "--vocab", "13", "--seq-len", "8", "--batch-size", "4"]
FAULTY = str(ROOT / "tests" / "programs" / "demo_with_fault.py")
ENDS_WITHIN = 10.0  # seconds from the fault to the end of the job


def no_partial_files(*folders) -> None:
    """Nothing half-written: no temporary file of an atomic write, anywhere under the folders."""
    for folder in folders:
        for _, _, files in os.walk(folder):
            assert not [f for f in files if f.endswith(".tmp")], f"temporary files left in {folder}: {files}"


@pytest.mark.parametrize("fault, expect", [
    ("kill", "BAD TERMINATION"),  # Hydra's own banner: the job ends at once, status != 0
    ("raise", "[rank 1] RuntimeError: injected failure in transformer.h.1.mlp backward on rank 1"),
])
def test_a_failing_rank_ends_the_job_within_seconds(tmp_path, fault, expect):
    t0 = time.time()
    r = run_mpi(2, [FAULTY, fault, "1", "2", *TINY, "--steps", "6", "--out", str(tmp_path)], timeout=90)
    assert r.returncode == (ABORTED if fault == "raise" else 9), r.stdout + r.stderr  # 9: Hydra's SIGKILL
    assert expect in r.stdout + r.stderr, r.stdout + r.stderr
    assert "UnboundLocalError" not in r.stderr, "no second exception after the abort"
    fault_at = float(re.search(r"FAULT \w+ at ([\d.]+)", r.stderr).group(1))
    assert t0 + r.seconds - fault_at < ENDS_WITHIN, f"ended {t0 + r.seconds - fault_at:.1f} s after the fault"
    no_partial_files(tmp_path)


def test_sigterm_to_mpiexec_ends_every_rank_with_one_line(tmp_path):
    cmd = [mpiexec(), "-n", "2", sys.executable, "-m", "tpsim.demo", *TINY, "--steps", "100000",
           "--out", str(tmp_path / "out")]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        for line in proc.stdout:  # wait until it trains
            if line.startswith("Training"):
                break
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        t0 = time.time()
        _, err = proc.communicate(timeout=30)
        seconds = time.time() - t0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "tpsim.demo: stopped by SIGTERM: every rank ends now (exit status 143)" in err, err
    assert "Traceback" not in err and seconds < ENDS_WITHIN, (seconds, err)
    no_partial_files(tmp_path)


def test_nonfinite_steps_are_skipped_then_training_stops(tmp_path):
    r = run_mpi(2, [FAULTY, "nan", "0", "2", *TINY, "--steps", "8", "--max-skipped-steps", "2",
                    "--out", str(tmp_path)], timeout=90)
    assert r.returncode == 1, r.stdout + r.stderr
    skipped = [line for line in r.stdout.splitlines() if "SKIPPED" in line]
    assert [line.split()[1] for line in skipped] == ["2", "3"], r.stdout
    assert "first non-finite gradient in backward order: transformer.h.1.mlp.c_fc.weight" in skipped[0]
    errors = [line for line in r.stderr.splitlines() if line.strip()]
    assert errors == [errors[0]] and errors[0].startswith("tpsim.demo: stopped: 2 consecutive steps skipped "
                                                          "(last at step 3): loss is nan"), r.stderr
    assert "RuntimeWarning" not in r.stderr


def test_one_nonfinite_step_is_skipped_and_training_goes_on(tmp_path):
    r = run_mpi(2, [FAULTY, "nan-once", "0", "1", *TINY, "--steps", "4", "--out", str(tmp_path)], timeout=90)
    assert r.returncode == 0, r.stdout + r.stderr
    assert [line.split()[1] for line in r.stdout.splitlines() if "SKIPPED" in line] == ["1"], r.stdout
    assert "(1 of 3 in a row)" in r.stdout and "VERDICT: MATCH" in r.stdout


def bad_checkpoints(folder) -> dict[str, tuple[str, str]]:
    """name -> (path, the expected one-line message)."""
    from tpsim.arch.gpt2 import GPTConfig

    cfg = GPTConfig(vocab_size=13, n_positions=8, n_embd=16, n_layer=2, n_head=2)
    rng = np.random.default_rng(0)
    good = folder / "good.npz"
    write_npz(good, {k: rng.standard_normal(s) for k, s in cfg.param_shapes().items()}, config=cfg, tp=1)
    data = good.read_bytes()
    (folder / "truncated.npz").write_bytes(data[: len(data) * 2 // 3])
    corrupt = bytearray(data)
    corrupt[len(data) // 2] ^= 0x55
    (folder / "corrupted.npz").write_bytes(bytes(corrupt))
    np.savez(folder / "foreign.npz", weights=np.zeros((3, 3)))
    return {"truncated": "not an .npz archive, or truncated",
            "corrupted": "is corrupted (Bad CRC-32",
            "foreign": "is not a tpsim checkpoint of this model (no manifest"}


# one launch per case, by design: each is its own error path, and a program stops at its first error
@pytest.mark.parametrize("case", ["truncated", "corrupted", "foreign"])
def test_bad_checkpoint_is_one_line_and_status_2(tmp_path, case):
    message = bad_checkpoints(tmp_path)[case]
    r = run_mpi(2, ["-m", "tpsim.demo", *TINY, "--steps", "1", "--init-from", str(tmp_path / f"{case}.npz"),
                    "--out", str(tmp_path / "out")], timeout=60)
    assert r.returncode == 2, r.stdout + r.stderr
    errors = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and f"{case}.npz" in errors[0] and message in errors[0], r.stderr
    assert r.stdout == "" and not (tmp_path / "out").exists(), "nothing computed, nothing written"


# one launch per case, by design: each is its own error path, and a program stops at its first error
@pytest.mark.parametrize("flag, path, message", [
    ("--out", "/proc/tpsim-out", "--out /proc/tpsim-out: cannot be created in /proc"),
    ("--out", "FILE", "exists and is a file, not a folder"),
    ("--export", "FILE/sub", "is a file, not a folder"),
    ("--save", "FILE", "exists and is a file, not a folder"),
])
def test_unwritable_output_is_one_line_and_status_2(tmp_path, flag, path, message):
    (tmp_path / "FILE").write_text("a file")
    path = path.replace("FILE", str(tmp_path / "FILE"))
    args = [flag, path] + (["--out", str(tmp_path / "out")] if flag != "--out" else [])
    r = run_mpi(2, ["-m", "tpsim.demo", *TINY, "--steps", "1", *args], timeout=60)
    assert r.returncode == 2, r.stdout + r.stderr
    errors = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and errors[0].startswith("tpsim.demo: error: ") and message in errors[0], r.stderr
    assert r.stdout == "", "nothing computed"


PIPELINE_FAULTY = str(ROOT / "tests" / "programs" / "pipeline_with_fault.py")


@pytest.mark.parametrize("rank, args", [
    (1, ["--pp", "4", "--schedule", "1f1b"]),  # a middle stage: both neighbours left waiting in a receive
    (2, ["--pp", "2", "--tp", "2", "--schedule", "interleaved", "--vp", "2"]),  # its TP partner in an all-reduce
], ids=["pp4-middle-stage", "pp2-tp2-interleaved"])
def test_a_rank_killed_mid_pipeline_ends_the_job_within_seconds(tmp_path, rank, args):
    """SIGKILL right after the rank's first pipeline message of step 1: the ranks waiting for its next messages
    must not wait for ever — the job ends, non-zero, within 10 s of the kill."""
    t0 = time.time()
    r = run_mpi(4, [PIPELINE_FAULTY, str(rank), "1", *args, *TINY, "--layers", "4", "--steps", "6",
                    "--out", str(tmp_path)], timeout=90)
    assert r.returncode != 0, r.stdout + r.stderr
    fault_at = float(re.search(r"FAULT kill at ([\d.]+)", r.stderr).group(1))
    assert t0 + r.seconds - fault_at < ENDS_WITHIN, f"ended {t0 + r.seconds - fault_at:.1f} s after the fault"
    assert "every check holds" not in r.stdout, "the run must not report success"
    no_partial_files(tmp_path)
