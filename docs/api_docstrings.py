"""Docstrings as the Python API pages show them, safely: tpsim writes them as plain text with ``literals``.

Most of that text is valid reStructuredText already (what autodoc expects), but nothing checks it, and with
warnings as errors one stray construct would fail the whole site. So each docstring, as autodoc reads it
(``autodoc-process-docstring``), gets

1. a literal that runs straight into a word (a plural such as SpanEvent in double backticks, then "s") closed
   the way reST wants (a backslash and a space after the closing backticks);
2. the "Alias for field number N" that Python writes for each field of a ``NamedTuple`` dropped (noise there);
3. a trial parse of its own with docutils: when that parse warns, or makes a section or a transition (which
   a docstring may not hold), the docstring is shown verbatim as a literal block instead — it loses its
   formatting, never the build. The build's log names the docstrings shown that way.

Sphinx's own roles (``:class:``) are unknown to a plain docutils parse, so a docstring using them would be shown
verbatim; tpsim's docstrings do not use them.
"""

from __future__ import annotations

import io
import re

LITERAL_INTO_WORD = re.compile(r"(``[^`\s](?:[^`]*?[^`\s])?``)(?=\w)")
FIELD_ALIAS = re.compile(r"^Alias for field number \d+$")


def normalized(lines: list[str]) -> list[str]:
    if len(lines) == 1 and FIELD_ALIAS.match(lines[0].strip()):
        return []
    return [LITERAL_INTO_WORD.sub(r"\1\\ ", line) for line in lines]


def problems(text: str) -> str:
    """What docutils says about ``text`` parsed alone ("" when it is clean and holds no section)."""
    from docutils import nodes
    from docutils.core import publish_doctree

    stream = io.StringIO()
    tree = publish_doctree(text, settings_overrides={"report_level": 2, "halt_level": 5, "warning_stream": stream,
                                                     "file_insertion_enabled": False, "raw_enabled": False})
    found = stream.getvalue()
    if any(isinstance(node, (nodes.section, nodes.transition)) for node in tree.findall()):
        found += "a section title or a transition"
    return found


def safe(lines: list[str]) -> list[str]:
    lines = normalized(lines)
    if not lines or not problems("\n".join(lines)):
        return lines
    return ["::", ""] + [f"    {line}" if line.strip() else "" for line in lines]


def _process(app, what, name, obj, options, lines):
    from sphinx.util import logging

    new = safe(list(lines))
    if new[:1] == ["::"]:
        logging.getLogger(__name__).info(f"the docstring of {name} is not valid reST: shown verbatim")
    lines[:] = new


def setup(app):
    app.connect("autodoc-process-docstring", _process)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
