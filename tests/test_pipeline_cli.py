"""``tpsim schedule`` and the grid it prints (``tpsim.schedule_cli``, ``grid``, ``figure``): the grid is the
timeline cell by cell, it wraps to the width, the bubble printed is the clock's beside the formula's, the figure
is a PNG, and every mistake is one line with exit status 2 — all without MPI."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tpsim import cli
from tpsim.schedule_cli import main
from tpsim.pipeline.clock import simulate
from tpsim.pipeline.grid import cells, format_grid, label
from tpsim.pipeline.schedules import build
from tpsim.predict.pipeline import bubble_fraction

ROOT = Path(__file__).resolve().parents[1]
CASES = [("afab", 4, 8, 1), ("1f1b", 4, 8, 1), ("interleaved", 4, 8, 2), ("interleaved", 2, 6, 3), ("zb-h1", 4, 8, 1),
         ("zb-h1", 5, 3, 1), ("1f1b", 1, 3, 1)]


@pytest.mark.parametrize("name, p, m, v", CASES)
def test_each_cell_is_what_the_timeline_runs_there(name, p, m, v):
    t = simulate(build(name, p, m, v))
    q = 1 / v  # the shortest unit-cost action: a chunk's F (and B, W when split)
    grid = cells(t)
    assert {len(row) for row in grid} == {round(t.step / q)}
    for rank, (actions, spans) in enumerate(zip(t.schedule.ranks, t.spans)):
        expected = ["."] * len(grid[rank])
        for a, (s, e) in zip(actions, spans):
            if a.op in ("F", "B", "W"):
                for col in range(round(s / q), round(e / q)):
                    expected[col] = label(a)
        assert grid[rank] == expected
        assert grid[rank].count(".") * q == pytest.approx(t.idle[rank])


def test_chunks_are_told_apart():
    grid = cells(simulate(build("interleaved", 2, 2, 2)))
    assert {"F0", "F0.1", "B1", "B1.1"} <= {c for row in grid for c in row}


@pytest.mark.parametrize("width", [40, 60, 100])
def test_a_wide_grid_wraps_into_blocks_that_fit_and_lose_no_column(width):
    t = simulate(build("1f1b", 4, 32))
    lines = format_grid(t, width=width)
    assert max(map(len, lines)) <= width
    rows = [line for line in lines if line.startswith("rank 0")]
    assert len(rows) > 1
    assert sum(len(r.split()) - 2 for r in rows) == len(cells(t)[0])
    heads = [line for line in lines if line.startswith("time ")]
    assert len(heads) == len(rows) and heads[0].startswith("time 0 to ")


def test_a_narrow_grid_is_one_block():
    lines = format_grid(simulate(build("1f1b", 2, 2)))
    assert len(lines) == 2 and lines[0].startswith("rank 0  ") and lines[1].startswith("rank 1  ")


@pytest.mark.parametrize("name, p, m, v", CASES)
def test_the_command_prints_the_grid_the_measured_bubble_and_the_formula(name, p, m, v, capsys):
    assert main(["--pp", str(p), "--microbatches", str(m), "--schedule", name, "--vp", str(v)]) == 0
    out = capsys.readouterr().out
    t = simulate(build(name, p, m, v))
    for line in format_grid(t):
        assert line in out.splitlines()
    found = re.search(r"measured ([0-9.]+)\n *formula .* = ([0-9.]+)\n", out)
    assert float(found.group(1)) == pytest.approx(t.bubble_fraction, abs=1e-6)
    assert float(found.group(2)) == pytest.approx(bubble_fraction(name, p, m, v), abs=1e-6)
    assert "(they differ)" not in out
    table = [line.split() for line in out.splitlines() if re.match(r"^\d+\s+[\d.]+\s+[\d.]+\s+\d+\s+\d+$", line)]
    assert [int(row[3]) for row in table] == t.peak_in_flight and all(row[3] == row[4] for row in table)
    assert max(map(len, out.splitlines())) <= 100


def test_out_draws_a_png(tmp_path, capsys):
    assert main(["--pp", "4", "--microbatches", "8", "--schedule", "interleaved", "--vp", "2",
                 "--out", str(tmp_path)]) == 0
    png = tmp_path / "schedule_interleaved_pp4_m8_vp2.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"wrote {png}" in capsys.readouterr().out


@pytest.mark.parametrize("argv, says", [
    (["--pp", "4", "--microbatches", "6", "--schedule", "interleaved", "--vp", "2"], "must be a multiple of --pp 4"),
    (["--pp", "4", "--microbatches", "8", "--schedule", "1f1b", "--vp", "2"], "one model chunk per rank"),
    (["--pp", "0", "--microbatches", "8"], "argument --pp: '0' is not a whole number >= 1"),  # the parser's
    (["--pp", "2", "--microbatches", "2", "--width", "5"], "--width 5"),
])
def test_a_mistake_is_one_line_and_exit_status_2(argv, says, capsys):
    try:
        status = main(argv)
    except SystemExit as stop:  # a value the parser refuses: argparse's exit, through tpsim.options
        status = stop.code
    assert status == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1
    assert captured.err.startswith("tpsim schedule: error: ") and says in captured.err


def test_tpsim_schedule_is_a_command_and_runs_without_mpi():
    assert "schedule" in cli.COMMANDS
    code = ("import sys; from tpsim.cli import main; rc = main(['schedule', '--pp', '2', '--microbatches', '3']); "
            "assert 'mpi4py' not in sys.modules, 'mpi4py was imported'; sys.exit(rc)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT,
                          env={"PYTHONPATH": str(ROOT), "PATH": ""})
    assert done.returncode == 0, done.stderr
    assert "rank 1" in done.stdout and "bubble" in done.stdout


def test_an_out_that_is_a_file_is_one_line_and_exit_2(tmp_path, capsys):
    from tpsim.schedule_cli import main as schedule_main
    afile = tmp_path / "afile"
    afile.write_text("x")
    assert schedule_main(["--pp", "2", "--microbatches", "2", "--out", str(afile)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "exists and is a file" in err and "Traceback" not in err
