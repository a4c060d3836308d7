"""The block diagrams of lessons 02, 04 and 05 (``tpsim.teach.diagrams``): what they say, and that it can be read.

Everything is read off the figure itself: its text artists (the labels, one "rank r" per lane), the colours of
the f and g boxes, the line styles of the arrows, and the renderer's bounding boxes — no two texts touch, none
leaves the canvas, every box label fits inside its box. The last test runs the three lessons and finds their PNGs.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from matplotlib.colors import to_hex

from launch_program import run_mpi
from tpsim.plotting import pyplot
from tpsim.teach.diagrams import attention_diagram, f_g_diagram, mlp_diagram
from tpsim.teach.diagrams.board import BACKWARD, F_COLOR, FORWARD, G_COLOR, Board
from tpsim.teach.diagrams.legibility import labels_outside_boxes, overlapping_texts, texts, texts_off_figure
from tpsim.teach.lessons import find_lesson

DIAGRAMS = {"f_g": f_g_diagram, "mlp": mlp_diagram, "attention": lambda p: attention_diagram(p, heads=8)}


@pytest.fixture
def draw():
    """``draw(name, p)`` → the figure, closed after the test."""
    made = []

    def _draw(name: str, p: int):
        made.append(DIAGRAMS[name](p))
        return made[-1]

    yield _draw
    for fig in made:
        pyplot().close(fig)


def strings(fig) -> list[str]:
    return [t.get_text() for t in texts(fig)]


def boxes(fig) -> dict:
    """``{label: patch}`` for every ``Board.box`` (its label and its patch share a gid)."""
    ax = fig.axes[0]
    patches = {p.get_gid(): p for p in ax.patches if p.get_gid()}
    return {t.get_text(): patches[t.get_gid()] for t in ax.texts if t.get_gid() in patches}


def arrows(fig) -> list:
    return [p for p in fig.axes[0].patches if type(p).__name__ == "FancyArrowPatch"]


@pytest.mark.parametrize("p", [1, 2, 4, 8])
@pytest.mark.parametrize("name", DIAGRAMS)
def test_no_text_overlaps_another_leaves_the_figure_or_overflows_its_box(draw, name, p):
    fig = draw(name, p)
    assert overlapping_texts(fig) == []
    assert texts_off_figure(fig) == []
    assert labels_outside_boxes(fig) == []


@pytest.mark.parametrize("p", [2, 4])
@pytest.mark.parametrize("name", DIAGRAMS)
def test_one_lane_per_rank_and_the_title_says_p(draw, name, p):
    fig = draw(name, p)
    lanes = [s for s in strings(fig) if re.fullmatch(r"rank \d+", s)]
    rows = 2 if name == "f_g" else 1  # the f/g board draws its lanes twice: forward, then backward
    assert lanes == [f"rank {r}" for r in range(p)] * rows
    assert any(s.startswith(("The parallel MLP", "Parallel self-attention", "f and g"))
               and f"p = {p} ranks" in s for s in strings(fig))


@pytest.mark.parametrize("name", DIAGRAMS)
def test_f_is_blue_and_g_is_red_in_every_diagram(draw, name):
    colours = {label: to_hex(patch.get_facecolor()) for label, patch in boxes(draw(name, 4)).items()}
    if name == "f_g":  # the f column and the g column, each pass named by what it equals
        assert {colours["identity\n= g backward"], colours["all-reduce\n= g forward"]} == {F_COLOR.lower()}
        assert {colours["all-reduce\n= f backward"], colours["identity\n= f forward"]} == {G_COLOR.lower()}
    else:
        assert (colours["f"], colours["g"]) == (F_COLOR.lower(), G_COLOR.lower())
    assert F_COLOR != G_COLOR


def test_mlp_names_f_g_their_passes_and_the_shapes_on_every_lane(draw):
    s = strings(draw("mlp", 4))
    assert {"f", "g", "forward: identity\nbackward: all-reduce", "forward: all-reduce\nbackward: identity"} <= set(s)
    assert {"X\n[b, s, h]", "Z\n[b, s, h]"} <= set(s)
    assert [x for x in s if x.startswith("X·A")] == ["X·A₀", "X·A₁", "X·A₂", "X·A₃"]
    assert [x for x in s if "·B" in x] == ["Y₀·B₀", "Y₁·B₁", "Y₂·B₂", "Y₃·B₃"]
    assert s.count("[b, s, 4h/p]") == 2 * 4 and s.count("[b, s, h] partial") == 4
    assert any("arXiv:1909.08053" in x and "Fig. 3a" in x for x in s)


def test_attention_gives_each_rank_whole_heads(draw):
    s = strings(draw("attention", 4))  # 8 heads on 4 ranks
    assert [x for x in s if x.startswith("q, k, v")] == [f"q, k, v of\nheads {2 * r}–{2 * r + 1}" for r in range(4)]
    assert s.count("softmax(q·kᵀ/√d)·v") == 4 and s.count("[b, s, 3h/p]") == 4 and s.count("[b, s, h/p]") == 4
    assert [x for x in s if x.startswith("ctx")] == ["ctx₀·B₀", "ctx₁·B₁", "ctx₂·B₂", "ctx₃·B₃"]
    assert {"f", "g", "Y\n[b, s, h]"} <= set(s) and any("Fig. 3b" in x for x in s)
    one_each = strings(draw("attention", 8))
    assert "q, k, v of\nhead 7" in one_each and any("1 whole head per rank" in x for x in one_each)


def test_attention_refuses_heads_that_do_not_split_evenly():
    with pytest.raises(ValueError, match="6 heads cannot be split evenly over 4 ranks"):
        attention_diagram(4, heads=6)
    with pytest.raises(ValueError, match="at least one rank"):
        mlp_diagram(0)


def test_f_g_board_shows_each_backward_is_the_other_forward(draw):
    p = 4
    fig = draw("f_g", p)
    s = strings(fig)
    assert {"f: copy_to_tensor_model_parallel_region", "g: reduce_from_tensor_model_parallel_region"} <= set(s)
    assert s.count("x") == 2 * p and s.count("Σᵣ δᵣ") == p and s.count("Σᵣ zᵣ") == p
    assert [x for x in s if x.startswith("δ") and x != "δ"] == [f"δ{d}" for d in "₀₁₂₃"]
    borders = {label: patch.get_linewidth() for label, patch in boxes(fig).items()}
    assert min(borders["all-reduce\n= g forward"], borders["all-reduce\n= f backward"]) > \
        max(borders["identity\n= g backward"], borders["identity\n= f forward"])  # communication: a thick border
    drawn = arrows(fig)
    dashed = [a for a in drawn if a.get_linestyle() == "--"]
    assert len(drawn) == 8 * p and len(dashed) == 4 * p  # 2 arrows per lane per pass; the backward ones dashed
    assert {to_hex(a.get_edgecolor()) for a in dashed} == {BACKWARD.lower()}
    assert {to_hex(a.get_edgecolor()) for a in drawn if a not in dashed} == {FORWARD.lower()}


def test_the_legibility_checks_find_what_they_look_for():
    board = Board(4, 2, "a title", "a caption")
    board.text(2, 1, "one label")
    board.text(2.1, 1.02, "its neighbour on top of it")
    board.text(3.9, 1.5, "off the right edge", ha="left")
    board.box(1.5, 0.4, 0.3, 0.2, "far too long for this box")
    try:
        assert ("one label", "its neighbour on top of it") in overlapping_texts(board.fig)
        assert texts_off_figure(board.fig) == ["off the right edge"]
        assert labels_outside_boxes(board.fig) == ["far too long for this box"]
    finally:
        pyplot().close(board.fig)


def test_a_diagram_saves_as_a_png_of_its_size(draw, tmp_path):
    fig = draw("mlp", 2)
    fig.savefig(tmp_path / "mlp.png", dpi=100)
    png = (tmp_path / "mlp.png").read_bytes()
    width, height = int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert (width, height) == tuple(round(v * 100) for v in fig.get_size_inches())


def test_diagrams_import_without_mpi():
    code = "import sys, tpsim.teach.diagrams; assert 'mpi4py' not in sys.modules, 'mpi4py was imported'"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


@pytest.mark.slow
@pytest.mark.parametrize("number, name", [("02", "02_f_and_g.png"), ("04", "04_mlp_f_g.png"),
                                          ("05", "05_attention_f_g.png")])
def test_the_lesson_saves_its_diagram(tmp_path, number, name):
    lesson = find_lesson(number)
    r = run_mpi(lesson.ranks, [str(lesson.path), "--out", str(tmp_path)], timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"wrote {tmp_path / name}" in r.stdout
