"""The course's and the site's tests carry the ``course`` marker: ``make test`` leaves them out, ``make
check-course`` runs them, and CI runs both (``.ci/run``).

They check the lessons, their exercises and checkers, the notebooks, the book and the documentation site — each
lesson and exercise run on real ranks, the site built with Sphinx — and they are most of the single-process
suite's time (issue "One step": ``make test`` within 10 minutes on 2 cores). The simulator, the planner and the
programs stay in ``make test``. The list is by file, here, so that a new course test joins by its name.
"""

from __future__ import annotations

import pytest

COURSE = {
    "test_lessons.py", "test_exercise_diagnoses.py", "test_checker_properties.py", "test_diagnose.py",
    "test_diagnoses_12_13.py", "test_diagnoses_14_15.py", "test_diagnoses_16.py", "test_diagnoses_17.py",
    "test_diagnoses_18.py", "test_diagnoses_19.py", "test_diagnoses_20.py", "test_diagnoses_21.py",
    "test_course.py", "test_lesson_text.py", "test_lesson_workspace.py", "test_teach_hints.py", "test_diagrams.py",
    "test_notebooks.py", "test_book.py",
    "test_docs.py", "test_docs_code.py", "test_docs_browser.py", "test_docs_lesson_pages.py",
}


def pytest_collection_modifyitems(items):
    for item in items:
        if item.path.name in COURSE and item.path.parent.name == "tests":
            item.add_marker(pytest.mark.course)
