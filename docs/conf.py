"""Sphinx configuration of tpsim's documentation site (docs/contributing.md says why these tools)."""

import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
sys.path[:0] = [str(DOCS), str(DOCS.parent)]  # the extensions here and tpsim (the checkout being documented)

project = "tpsim"
author = "the tpsim authors"
copyright = "the tpsim authors"

# cli_reference: the command reference from the parsers; lesson_pages: the course's pages from the lessons and
# a (cached) run of each; api_docstrings: tpsim's plain-text docstrings made safe for autodoc; course_path: the
# course-as-a-path tables of course.md, from tpsim.teach.course
extensions = ["myst_parser", "sphinx.ext.autodoc", "cli_reference", "lesson_pages", "api_docstrings", "course_path"]
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build", "README.md"]
myst_enable_extensions = ["colon_fence", "deflist", "dollarmath"]  # $x$ and $$x$$ in a lesson's prose are math
myst_heading_anchors = 3          # [text](page.md#a-heading) works here as on GitHub

html_theme = "pydata_sphinx_theme"
html_title = "tpsim"
html_theme_options = {"navigation_with_keys": False, "show_toc_level": 2}
html_static_path: list[str] = []
# the theme's light/dark switch starts from this; left unset, a first visit logs "Got invalid theme mode" to the
# console (tests/test_docs_browser.py)
html_context = {"default_mode": "auto"}

# the Python API pages (docs/reference/api/): members in the order of the code (a package's __all__), defaults as
# written in the source, type names without their module path
autodoc_member_order = "bysource"
autodoc_preserve_defaults = True
python_use_unqualified_type_names = True
