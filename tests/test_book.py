"""The lesson book (``tpsim lesson book``): how a run's output is split per cell, then the whole book built once
— every lesson run under mpiexec and rendered by nbconvert (about a minute here for all sixteen) — and every page
checked for its prose, its CHECK lines, its summary line and its figures, and the index for every lesson.

Splitting needs nothing beyond tpsim; building needs nbconvert and nbformat (the ``notebooks`` extra) and is
skipped, with that reason, without them. ``notebook mode`` of ``Lesson`` is tested here too, in-process.
"""

from __future__ import annotations

import html
import re
import sys

import pytest

from tpsim.teach.lessons import discover, read_checks
from tpsim.teach.run_cells import CELL_MARK, FIGURE_MARK, split_output

LESSONS = discover()


def test_output_is_split_at_the_cell_markers_and_figures_go_with_their_cell():
    text = "\n".join(["a warning before anything", CELL_MARK.format(index=0), "first", CELL_MARK.format(index=1),
                      CELL_MARK.format(index=2), "wrote 03_x.png", FIGURE_MARK.format(name="03_x.png"),
                      "CHECK a: 1 ... OK", ""])
    texts, figures = split_output(text, 3)
    assert texts == ["a warning before anything\nfirst", "", "wrote 03_x.png\nCHECK a: 1 ... OK"]
    assert figures == [[], [], ["03_x.png"]]


def test_a_lesson_in_a_notebook_raises_instead_of_exiting_and_shows_its_figures(monkeypatch, tmp_path):
    import tpsim.teach.runtime as runtime

    shown = []
    monkeypatch.setattr(runtime, "in_kernel", lambda: True)
    monkeypatch.setattr(runtime, "show_inline", shown.append)
    hook = sys.excepthook
    lesson = runtime.Lesson("01", 1, argv=["--out", str(tmp_path)])
    assert lesson.notebook and sys.excepthook is hook, "no excepthook that would abort the engines"
    plt = lesson.pyplot()
    lesson.save(plt.figure(), "fig.png")
    assert shown == [tmp_path / "fig.png"]
    lesson.check("a claim that fails", "on purpose", False)
    with pytest.raises(runtime.LessonFailed, match="lesson 01: 1 of 1 checks FAILED"):
        lesson.finish()


def test_book_without_nbconvert_says_which_extra_to_install(monkeypatch, capsys):
    import importlib.util

    from tpsim.cli import main as tpsim_main

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "nbconvert" else real(name, *a))
    assert tpsim_main(["lesson", "book", "02"]) == 2
    assert 'needs nbconvert: pip install -e ".[notebooks]"' in capsys.readouterr().err


# --- the whole book -----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def book(tmp_path_factory):
    for module in ("nbformat", "nbconvert"):
        pytest.importorskip(module, reason=f"{module} missing: pip install -e '.[notebooks]' builds the book")
    from tpsim.teach.book import build_book

    out = tmp_path_factory.mktemp("book")
    return out, build_book(LESSONS, out, timeout=120)


@pytest.mark.slow
def test_every_lesson_has_a_page_whose_run_passed(book):
    out, pages = book
    assert [p.info.number for p in pages] == [info.number for info in LESSONS]
    for page in pages:
        assert page.ok, f"lesson {page.info.number}: exit status {page.returncode}, checks {page.checks}"
        assert page.html.is_file() and page.html.parent == out


@pytest.mark.slow
@pytest.mark.parametrize("number", [info.number for info in LESSONS])
def test_page_has_its_prose_code_check_lines_and_figures(book, number):
    out, pages = book
    page = next(p for p in pages if p.info.number == number)
    text = page.html.read_text(encoding="utf-8")
    plain = html.unescape(re.sub(r"<[^>]+>", "", text))
    assert html.unescape(page.info.title) in plain, "the lesson's title (its first prose cell)"
    assert "lesson.finish()" in plain, "the lesson's code"
    checks = read_checks(plain)
    assert checks == page.checks and len(checks) > 0, "every CHECK line of the run, on the page"
    assert f"lesson {number}: {len(checks)} checks, all OK" in plain
    images = re.findall(r'<img [^>]*src="([^"]+)"', text)
    assert sorted(images) == sorted(page.figures)
    for name in images:
        assert (out / name).read_bytes()[:4] == b"\x89PNG", f"{name} is next to the page"
    if "lesson.save(" in page.info.path.read_text():
        assert images, f"lesson {number} saves a figure; its page shows none"
    assert 'href="index.html"' in text


@pytest.mark.slow
def test_index_lists_every_lesson_with_title_ranks_and_a_link(book):
    out, pages = book
    index = (out / "index.html").read_text(encoding="utf-8")
    for page in pages:
        row = re.search(rf"<tr><td>{page.info.number}</td>.*?</tr>", index)
        assert row, f"lesson {page.info.number} missing from the index"
        assert f'href="{page.html.name}"' in row.group(0) and html.escape(page.info.title) in row.group(0)
        assert f"<td>{page.info.ranks}</td>" in row.group(0)
    every_png = {p.name for p in out.glob("*.png")}
    assert every_png == {name for p in pages for name in p.figures if name.endswith(".png")}, \
        "every figure a lesson wrote is linked from its page"


# --- one page, from a lesson written for the test -----------------------------------------------------------------
SYNTHETIC = '''\
# %% [markdown]
# # Lesson 98 — A lesson written for a test

# %%
RANKS = 2
from tpsim.teach.runtime import Lesson

lesson = Lesson("98", RANKS)
lesson.say("said in the first cell")

# %% [markdown]
# Prose between the cells.

# %%
lesson.check("the second cell holds", "yes", True)
if lesson.rank == 0:
    plt = lesson.pyplot()
    lesson.save(plt.figure(figsize=(1, 1)), "98_figure.png")

# %%
lesson.check("a claim that fails on rank 1 only", "rank 0 says fine", lesson.rank != 1)
lesson.finish()
'''


def _synthetic(tmp_path, text: str):
    from tpsim.teach.lessons import LessonInfo

    path = tmp_path / "98_synthetic.py"
    path.write_text(text)
    return LessonInfo("98", path, "A lesson written for a test", 2)


@pytest.mark.slow
def test_each_cells_output_and_figure_sit_under_that_cell_and_a_failure_shows_in_the_index(tmp_path):
    for module in ("nbformat", "nbconvert"):
        pytest.importorskip(module, reason=f"{module} missing: pip install -e '.[notebooks]' builds the book")
    from tpsim.teach.book import build_book

    out = tmp_path / "book"
    (page,) = build_book([_synthetic(tmp_path, SYNTHETIC)], out, timeout=60)
    assert page.returncode == 1 and not page.ok  # the lesson's own exit status: a CHECK failed
    assert page.checks == [("the second cell holds: yes", True),
                           ("a claim that fails on rank 1 only: rank 0 says fine (but not on every rank)", False)]
    plain = html.unescape(re.sub(r"<[^>]+>", "", page.html.read_text(encoding="utf-8")))
    order = ['lesson.say("said in the first cell")', "\nsaid in the first cell", "Prose between the cells.",
             'lesson.check("the second cell holds"', "CHECK the second cell holds", "wrote 98_figure.png",
             'lesson.check("a claim that fails', "CHECK a claim that fails", "lesson 98: 2 checks, 1 FAILED"]
    at = [plain.find(piece) for piece in order]
    assert -1 not in at and at == sorted(at), dict(zip(order, at))
    assert page.figures == ["98_figure.png"] and (out / "98_figure.png").is_file()
    assert 'class="failed"' in (out / "index.html").read_text(encoding="utf-8")


@pytest.mark.slow
def test_a_traceback_points_at_the_lesson_files_own_line(tmp_path):
    from tpsim.teach.book import run_lesson_cells

    broken = SYNTHETIC.replace("lesson.finish()", "raise ValueError('broken on purpose')")
    info = _synthetic(tmp_path, broken)
    line = broken.splitlines().index("raise ValueError('broken on purpose')") + 1
    run = run_lesson_cells(info, tmp_path, timeout=60)
    assert run.returncode != 0
    assert f'File "{info.path}", line {line}' in run.stdout and "ValueError: broken on purpose" in run.stdout
