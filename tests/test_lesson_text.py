"""The lessons' text, read as files (no MPI): every lesson names its sources, and the recap a run prints is there.

What a run prints is tested in ``test_lessons.py`` (slow: it launches every lesson); this file checks the
sources in seconds.
"""

from __future__ import annotations

import re

import pytest

from tpsim.teach.lessons import discover
from tpsim.teach.runtime import markdown_section

LESSONS = discover()
ARXIV = re.compile(r"arXiv:\d{4}\.\d{4,5}")


def first_markdown_cell(text: str) -> str:
    return text.split("\n# %%\n", 1)[0]


@pytest.mark.parametrize("lesson", LESSONS, ids=lambda info: info.path.stem)
def test_every_lesson_names_its_sources_in_its_first_cell(lesson):
    intro = first_markdown_cell(lesson.path.read_text(encoding="utf-8"))
    assert "\n# Sources: " in intro, f"{lesson.path.name}: no '# Sources: ...' paragraph in the first markdown cell"
    sources = intro.split("\n# Sources: ", 1)[1].split("\n#\n")[0]  # up to the paragraph's end
    assert ARXIV.search(sources), f"{lesson.path.name}: its sources name no paper by arXiv number: {sources}"


@pytest.mark.parametrize("lesson", LESSONS, ids=lambda info: info.path.stem)
def test_the_recap_a_run_prints_is_the_take_away_cell(lesson):
    recap = markdown_section(lesson.path, "What to take away")
    assert recap and recap[0].startswith("* "), recap
    assert recap[-1].endswith(f"`tpsim check {lesson.number}`."), recap[-1]
    assert not any(line.startswith(("# %%", "lesson.")) for line in recap), "the recap ran into the next cell"


def test_citations_a_reader_can_follow():
    """'§3.1' and 'equations (3) and (4)' say whose: the SenseParrots article's, never an unnamed 'the paper'."""
    offenders = []
    for lesson in LESSONS:
        for number, line in enumerate(lesson.path.read_text(encoding="utf-8").splitlines(), 1):
            if re.search(r"of the paper\b|The article's §", line):
                offenders.append(f"{lesson.path.name}:{number}: {line.strip()}")
    assert offenders == []
