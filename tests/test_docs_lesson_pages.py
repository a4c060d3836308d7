"""docs/lesson_pages.py on a lessons folder of its own: a page is the lesson's cells and its run's output, a run
is reused until the lesson changes, and a lesson whose run fails fails the build, its output in the message."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "docs"))
import lesson_pages  # noqa: E402

pytestmark = pytest.mark.slow  # each generate() that runs a lesson launches mpiexec

LESSON = """\
# %% [markdown]
# # Lesson 01 — Two cells
#
# Prose, with $x^2$ as math and a [link](02_elsewhere.py) to a file beside the lesson.

# %%
RANKS = 1
print("CHECK one is one: 1 ... {verdict}")
"""


def generate(tmp_path: Path, text: str) -> dict:
    root = tmp_path / "lessons"
    root.mkdir(exist_ok=True)
    (root / "01_two_cells.py").write_text(text)
    return lesson_pages.generate(lessons_root=root, pages=tmp_path / "course", cache=tmp_path / "cache",
                                 say=lambda line: None)


def test_a_page_is_the_lessons_cells_and_a_run_reused_until_the_lesson_changes(tmp_path):
    assert not generate(tmp_path, LESSON.format(verdict="OK"))["01"].cached
    page = (tmp_path / "course" / "01_two_cells.md").read_text()
    assert "# Lesson 01 — Two cells" in page and "$x^2$" in page
    assert "```python\nRANKS = 1\nprint(" in page and "```text\nCHECK one is one: 1 ... OK\n```" in page
    assert "](../../lessons/02_elsewhere.py)" in page, "a link of the lesson's is relative to lessons/"
    assert generate(tmp_path, LESSON.format(verdict="OK"))["01"].cached
    changed = generate(tmp_path, LESSON.format(verdict="OK") + 'print("one more line")\n')["01"]
    assert not changed.cached and "one more line" in changed.output


def test_a_lesson_whose_run_fails_fails_the_build_with_its_output(tmp_path):
    with pytest.raises(RuntimeError) as failed:
        generate(tmp_path, LESSON.format(verdict="FAILED"))
    message = str(failed.value)
    assert "1 of 1 CHECKs FAILED" in message and "CHECK one is one: 1 ... FAILED" in message, message
    assert not (tmp_path / "course" / "01_two_cells.md").exists(), "no page for a failed run"
    assert not (tmp_path / "cache" / "01_two_cells").exists(), "a failed run is not cached"
    assert "... FAILED" in (tmp_path / "cache" / "01_two_cells.failed.log").read_text()
    with pytest.raises(RuntimeError, match="exit status 3"):
        generate(tmp_path, LESSON.format(verdict="OK") + "raise SystemExit(3)\n")
