"""Failing well, in one process: paths checked before work, atomic writes, the checkpoint manifest, the step guard.

The whole-program versions (a rank killed, SIGTERM to mpirun, a bad --init-from, a NaN at step k) are in
test_faults.py; these are the pieces they stand on, fast and MPI-free.
"""

import json
import os
import zipfile

import numpy as np
import pytest

from tpsim import atomic
from tpsim.errors import ConfigError, TrainingStopped
from tpsim.arch.gpt2 import GPTConfig
from tpsim.npzfile import CheckpointError, check_model, read_npz, write_npz
from tpsim.paths import check_input_file, check_output_dir, check_output_file
from tpsim.train.nonfinite import FOUND_INF, StepGuard, first_nonfinite

CFG = GPTConfig(vocab_size=13, n_positions=8, n_embd=8, n_layer=1, n_head=2)


def tensors(seed=0):
    rng = np.random.default_rng(seed)
    return {k: rng.standard_normal(s) for k, s in CFG.param_shapes().items()}


# --- paths ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("make, message", [
    (lambda d: (d / "f").write_text("x") and d / "f", "exists and is a file, not a folder"),
    (lambda d: (d / "f").write_text("x") and d / "f" / "sub", "is a file, not a folder"),
    (lambda d: "/proc/tpsim-out", "cannot be created in /proc"),
])
def test_bad_output_folders_are_one_line(tmp_path, make, message):
    with pytest.raises(ConfigError, match=message) as info:
        check_output_dir(make(tmp_path), "--out")
    assert str(info.value).startswith("--out ") and "\n" not in str(info.value)


def test_good_output_folders_pass_and_nothing_is_created(tmp_path):
    assert check_output_dir(tmp_path / "a" / "b", "--out") == str(tmp_path / "a" / "b")
    assert check_output_dir(tmp_path, "--out") == str(tmp_path)
    assert os.listdir(tmp_path) == [], "the check creates no folder and leaves no probe file"
    with pytest.raises(ConfigError, match="is a folder, expected a file name"):
        check_output_file(tmp_path, "--save")


def test_input_files(tmp_path):
    with pytest.raises(ConfigError, match="--init-from .*: no such file"):
        check_input_file(tmp_path / "missing.npz", "--init-from")
    with pytest.raises(ConfigError, match="is a folder, expected a file"):
        check_input_file(tmp_path, "--init-from")
    (tmp_path / "ok.npz").write_bytes(b"x")
    assert check_input_file(tmp_path / "ok.npz", "--init-from")


# --- atomic writes ----------------------------------------------------------------------------------------------
def test_atomic_write_leaves_old_file_or_whole_new_one(tmp_path):
    path = tmp_path / "a.json"
    atomic.write_text(path, "old\n")
    assert oct(path.stat().st_mode & 0o777) == oct(0o666 & ~atomic._umask()), "the mode open() would give"

    def broken(f):
        f.write(b"half of the ne")
        raise OSError("disk full")
    with pytest.raises(OSError, match="disk full"):
        atomic.atomic_write(path, broken)
    assert path.read_text() == "old\n" and os.listdir(tmp_path) == ["a.json"], "no temporary file left behind"


def test_discard_partial_removes_writes_in_progress(tmp_path):
    def killed_midway(f):
        f.write(b"partial")
        atomic.discard_partial()  # what the signal thread does before os._exit
        assert not any(n.endswith(".tmp") for n in os.listdir(tmp_path))
        raise SystemExit(143)
    with pytest.raises(SystemExit):
        atomic.atomic_write(tmp_path / "x.jsonl", killed_midway)
    assert os.listdir(tmp_path) == []


# --- checkpoint files -------------------------------------------------------------------------------------------
def test_manifest_roundtrip_keeps_keys_the_parameter_names(tmp_path):
    t = tensors()
    write_npz(tmp_path / "p.npz", t, config=CFG, tp=2, dp=4)
    with np.load(tmp_path / "p.npz") as plain:
        assert plain.files == list(t), "np.load sees exactly the parameters: the manifest is the zip comment"
    arrays, found = read_npz(tmp_path / "p.npz")
    assert all(np.array_equal(arrays[k], t[k]) for k in t)
    assert (found["format"], found["version"], found["tp"], found["dp"], found["dtype"]) == \
        ("tpsim-checkpoint", 1, 2, 4, "float64")
    assert found["model"]["n_layer"] == 1 and set(found["arrays"]) == set(t)
    check_model(found, CFG, "p.npz")
    with pytest.raises(CheckpointError, match=r"p.npz: written for another model: n_layer 1 \(this model: 2\)"):
        check_model(found, GPTConfig(vocab_size=13, n_positions=8, n_embd=8, n_layer=2, n_head=2), "p.npz")


def damaged(tmp_path, how: str):
    path = tmp_path / f"{how}.npz"
    write_npz(path, tensors(), config=CFG)
    data = bytearray(path.read_bytes())
    if how == "truncated":
        data = data[: len(data) // 2]
    elif how == "corrupted":
        data[len(data) // 3] ^= 0xFF
    path.write_bytes(bytes(data))
    return path


@pytest.mark.parametrize("how, message", [
    ("truncated", r"cannot read .*truncated.npz: not an .npz archive, or truncated"),
    ("corrupted", r"cannot read .*corrupted.npz: array transformer\.\S+ is corrupted \(Bad CRC-32"),
])
def test_damaged_files_are_one_line_naming_file_and_array(tmp_path, how, message):
    with pytest.raises(CheckpointError, match=message) as info:
        read_npz(damaged(tmp_path, how))
    assert "\n" not in str(info.value)


def test_checksum_catches_bytes_the_zip_crc_does_not(tmp_path):
    """Rewrite one array with new bytes (valid zip CRCs) under the old manifest: only the crc32 can tell."""
    path = tmp_path / "p.npz"
    write_npz(path, tensors(), config=CFG)
    with zipfile.ZipFile(path) as zf:
        comment = zf.comment
    other = tensors(seed=1)
    write_npz(path, other, config=CFG)
    with zipfile.ZipFile(path, "a") as zf:
        zf.comment = comment
    with pytest.raises(CheckpointError, match=r"array transformer.wte.weight fails its checksum"):
        read_npz(path)


def test_foreign_and_future_files(tmp_path):
    np.savez(tmp_path / "plain.npz", **tensors())
    arrays, found = read_npz(tmp_path / "plain.npz")
    assert found is None and set(arrays) == set(CFG.param_shapes()), "no manifest: read; the caller checks names"
    path = tmp_path / "future.npz"
    write_npz(path, tensors())
    with zipfile.ZipFile(path, "a") as zf:
        zf.comment = json.dumps({"format": "tpsim-checkpoint", "version": 99}).encode()
    with pytest.raises(CheckpointError, match="manifest version 99"):
        read_npz(path)
    (tmp_path / "text.npz").write_text("not a zip")
    with pytest.raises(CheckpointError, match="not an .npz archive"):
        read_npz(tmp_path / "text.npz")


# --- the step guard ---------------------------------------------------------------------------------------------
def test_guard_skips_nonfinite_steps_and_stops_after_max_in_a_row():
    guard = StepGuard(max_skipped=2)
    for loss, norm, skipped in [(3.0, 1.0, False), (np.nan, np.nan, True), (3.0, 1.0, False),
                                (3.0, np.inf, True)]:
        verdict = guard.decide(loss, norm)
        assert verdict.skipped == skipped and verdict.counted
        guard.record(verdict)
    assert guard.decide(3.0, np.inf).reason == "gradient norm is inf"
    with pytest.raises(TrainingStopped, match="stopped: 2 consecutive steps skipped .*gradient norm is inf"):
        guard.record(guard.last, step=7)


def test_loss_scaler_overflow_skips_without_counting():
    guard = StepGuard(max_skipped=1)
    for _ in range(5):  # an fp16 scaler halving its scale: skipped, never a stop
        verdict = guard.decide(3.0, np.inf, found_inf=True)
        assert verdict.skipped and verdict.reason == FOUND_INF and not verdict.counted
        guard.record(verdict)
    assert guard.consecutive == 0 and guard.skipped_total == 5
    with pytest.raises(TrainingStopped, match="loss is nan"):  # a NaN loss counts, scaler or not
        guard.record(guard.decide(np.nan, np.inf, found_inf=True))


def test_first_nonfinite_is_the_first_in_backward_order():
    grads = [("a", np.ones(3)), ("b", np.array([1.0, np.nan])), ("c", np.array([np.inf])), ("d", np.ones(2))]
    assert first_nonfinite(grads) == "c"
    assert first_nonfinite(grads[:1]) is None
