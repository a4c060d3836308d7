"""Sphinx extension: the course as a path, in docs/course.md, from ``tpsim.teach.course`` (so it cannot drift).

The marker ``<!-- course-path -->`` in course.md becomes two tables: per lesson what it needs first, its
exercises, what it checks and its run time; then the suggested week. ``tpsim lesson list`` prints the same data.
"""

from __future__ import annotations

from tpsim.teach.course import COURSE, MEASURED, WEEK
from tpsim.teach.lessons import discover, exercise_files, lesson_of

MARKER = "<!-- course-path -->"


def _lesson_link(number: str, pages: dict[str, str]) -> str:
    return f"[{number}](course/{pages[number]}.md)" if number in pages else number


def tables() -> str:
    lessons = {info.number: info for info in discover()}
    pages = {n: info.path.stem for n, info in lessons.items()}
    exercises = exercise_files()
    rows = ["| lesson | needs first | exercises | what it checks | ranks | run |", "|---|---|---|---|---|---|"]
    for number, info in lessons.items():
        place = COURSE[number]
        needs = ", ".join(_lesson_link(n, pages) for n in place.needs) or "—"
        mine = ", ".join(n for n in exercises if lesson_of(n) == number) or "—"
        rows.append(f"| {_lesson_link(number, pages)} {info.title} | {needs} | {mine} | {place.checks} | "
                    f"{info.ranks} | ~{place.seconds} s |")
    week = ["| day | lessons | about |", "|---|---|---|"]
    week += [f"| {day} | {', '.join(_lesson_link(n, pages) for n in days)} | {about} |" for day, days, about in WEEK]
    return "\n".join([*rows, "", f"Run time: the wall time of {MEASURED}.", "",
                      "A one-week course, a day's lessons with their exercises:", "", *week])


def _source_read(app, docname, source):
    if docname == "course" and MARKER in source[0]:
        source[0] = source[0].replace(MARKER, tables())


def setup(app):
    app.connect("source-read", _source_read)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
