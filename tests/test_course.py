"""The course as a path (tpsim.teach.course) matches the lessons folder, and ``tpsim lesson list`` shows it."""

from __future__ import annotations

from tpsim.cli import main as tpsim_main
from tpsim.teach.cli import LIST_WIDTH
from tpsim.teach.course import COURSE, WEEK
from tpsim.teach.lessons import discover, exercise_files, lesson_of

LESSONS = [info.number for info in discover()]


def test_every_lesson_has_its_place_and_needs_only_earlier_lessons():
    assert sorted(COURSE) == LESSONS
    for number, place in COURSE.items():
        assert place.needs == tuple(sorted(place.needs)), number
        assert all(need in COURSE and need < number for need in place.needs), (number, place.needs)
        assert place.checks and place.seconds > 0, number


def test_every_lesson_but_the_first_builds_on_one_before_it_and_each_is_needed_or_last():
    needed = {need for place in COURSE.values() for need in place.needs}
    assert all(COURSE[n].needs for n in LESSONS[1:])
    # 19 (where the time goes) ends the pipeline road; 20 (context parallelism) starts again from 06, 10, 11 and
    # ends its own; 21 (ZeRO's stages) goes back to 14 and 16
    side_roads = {"09", "13", "19", "20"}
    assert set(LESSONS[:-1]) - needed <= side_roads, "a lesson nothing builds on is a side road: say which"


def test_the_week_takes_every_lesson_once_in_order_after_what_it_needs():
    order = [n for _, lessons, _ in WEEK for n in lessons]
    assert order == LESSONS
    for day, (_, lessons, _) in enumerate(WEEK):
        seen = {n for _, earlier, _ in WEEK[:day + 1] for n in earlier}
        assert all(set(COURSE[n].needs) <= seen for n in lessons)


def test_lesson_list_shows_needs_exercises_checks_and_time_within_the_width(capfd):
    assert tpsim_main(["lesson", "list"]) == 0
    out = capfd.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= LIST_WIDTH
    flat = " ".join(out.split())
    for number, place in COURSE.items():
        assert " ".join(place.checks.split()) in flat, number
        assert f"~{place.seconds} s" in out
        mine = [n for n in exercise_files() if lesson_of(n) == number]
        assert f"exercise {', '.join(mine)}" in flat, number
    assert "needs 10, 11, 12, 14, 15" in flat
