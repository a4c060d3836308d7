"""Sphinx configuration of tpsim's documentation site (docs/contributing.md says why these tools)."""

import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
sys.path[:0] = [str(DOCS), str(DOCS.parent)]  # cli_reference (here) and tpsim (the checkout being documented)

project = "tpsim"
author = "the tpsim authors"
copyright = "the tpsim authors"

extensions = ["myst_parser", "cli_reference"]
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build", "README.md"]
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3          # [text](page.md#a-heading) works here as on GitHub

html_theme = "pydata_sphinx_theme"
html_title = "tpsim"
html_theme_options = {"navigation_with_keys": False, "show_toc_level": 2}
html_static_path: list[str] = []
