"""tpsim.allocator: freed activation memory stays in the process (glibc mallopt), TPSIM_MALLOC to opt out."""

import resource
import sys

import numpy as np
import pytest

from launch_program import run_mpi
from tpsim import allocator
from tpsim.errors import ConfigError

glibc_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mallopt is glibc's (Linux)")


def test_modes_are_checked_with_one_clear_error():
    assert allocator.check_mode({}) == "keep"
    assert allocator.check_mode({"TPSIM_MALLOC": "default"}) == "default"
    with pytest.raises(ConfigError, match="TPSIM_MALLOC must be keep or default, got 'yes'"):
        allocator.check_mode({"TPSIM_MALLOC": "yes"})


def test_default_mode_and_unknown_values_change_nothing_at_import():
    assert allocator.keep_freed_memory({"TPSIM_MALLOC": "default"}) is False
    assert allocator.keep_freed_memory({"TPSIM_MALLOC": "yes"}) is False  # refused later by check_mode


def _minor_faults(step, repeats: int = 5) -> int:
    step()  # warm: the first step faults its pages in whatever the setting
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(repeats):
        step()
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


@glibc_only
def test_a_step_that_frees_and_reallocates_big_arrays_stops_page_faulting():
    """The effect itself: with the settings (applied by ``import tpsim``, so already on in this process), a
    step that allocates, touches and frees three 8 MiB arrays faults (almost) no pages after the first step.
    Without them each array is a fresh mmap: 3 × 2048 pages of 4 KiB per step."""
    assert allocator.keep_freed_memory({}) is True  # glibc accepted both values

    def step():
        a = np.ones((2048, 1024), dtype=np.float32)  # 8 MiB, touched
        b = a * 2.0
        c = a + b
        del a, b, c

    faults = _minor_faults(step)
    assert faults < 5 * 2048 * 3 // 10, f"{faults} minor page faults in 5 steps: freed memory went back"


def test_unknown_mode_stops_an_entry_point_with_one_line_and_status_2(monkeypatch, tmp_path):
    monkeypatch.setenv("TPSIM_MALLOC", "yes")
    r = run_mpi(2, ["-m", "tpsim.demo", "--steps", "1", "--out", str(tmp_path / "out")], timeout=60)
    assert r.returncode == 2, r.stdout + r.stderr
    errors = [line for line in r.stderr.splitlines() if line.strip()]
    assert errors == ["tpsim.demo: error: TPSIM_MALLOC must be keep or default, got 'yes'"], r.stderr
    assert r.stdout == "" and not (tmp_path / "out").exists(), "nothing computed, nothing written"
