"""What pyproject.toml cannot say: the course installed with the package.

The lessons live at the top of the repository (``lessons/``, next to ``tpsim/``), where a reader of a clone finds
them; a wheel installs the same files as ``tpsim/lessons/`` (lessons, exercise stubs, reference answers, and
``figures/`` as ``tpsim/lessons/figures/``: the committed studies and pictures the lessons read), so that
``tpsim lesson list|start|run`` and ``tpsim check`` work from ``pip install tpsim`` too
(``tpsim.teach.lessons.lessons_dir`` looks in both places). Everything else is in pyproject.toml.
"""

from setuptools import find_packages, setup

COURSE = {"tpsim.lessons": "lessons",
          "tpsim.lessons.exercises": "lessons/exercises",
          "tpsim.lessons.solutions": "lessons/solutions",
          "tpsim.lessons.figures": "figures"}  # the committed studies a lesson reads (lesson 15: the drift study)

setup(packages=find_packages(include=["tpsim", "tpsim.*"]) + list(COURSE),
      package_dir=COURSE,
      package_data={"tpsim.lessons.figures": ["*.json", "*.png"]})
