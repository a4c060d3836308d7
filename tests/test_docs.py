"""The documentation site, read the way a user reads it: it builds with no warning, every relative link and
image of docs/ and README.md leads somewhere (on disk, so the pages work on GitHub too), so does every link of
the lessons' generated pages and of the built site (the API pages and the theme's links too), every lesson has
its page, and every option of every command is in the generated reference.

The build needs docs/requirements.txt (``make docs`` installs it); without it those tests skip and say so.
"""

from __future__ import annotations

import html
import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
sys.path.insert(0, str(DOCS))
import cli_reference  # noqa: E402  (docs/cli_reference.py: the parsers the reference is generated from)

MISSING = [name for name in ("sphinx", "myst_parser", "pydata_sphinx_theme") if importlib.util.find_spec(name) is None]
needs_docs_tools = pytest.mark.skipif(bool(MISSING), reason=f"docs requirements not installed ({', '.join(MISSING)}): "
                                                            "make docs installs docs/requirements.txt")

GENERATED = DOCS / "course"  # the lessons' pages, written by docs/lesson_pages.py when the site is built
PAGES = sorted(p for p in DOCS.rglob("*.md") if "_build" not in p.parts and not p.is_relative_to(GENERATED))
LINK = re.compile(r"(!?)\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.M | re.S)
INLINE_CODE = re.compile(r"`[^`\n]*`")


def links(path: Path) -> list[tuple[bool, str]]:
    """(is_image, target) of every Markdown link and image outside code."""
    text = INLINE_CODE.sub("", FENCE.sub("", path.read_text()))
    return [(bang == "!", target) for bang, target in LINK.findall(text)]


def slug(heading: str) -> str:
    """GitHub's (and MyST's) anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", INLINE_CODE.sub(lambda m: m.group(0)[1:-1], heading).strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = FENCE.sub("", path.read_text())
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", text, re.M)}


def broken_links(page: Path) -> list[str]:
    broken = []
    for is_image, target in links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        dest = (page.parent / file_part).resolve() if file_part else page
        if not dest.exists():
            broken.append(f"{'image' if is_image else 'link'} {target}: no {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest}")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"link {target}: no heading #{anchor} in {dest.relative_to(ROOT)}")
    return broken


@pytest.mark.parametrize("page", [ROOT / "README.md", *PAGES], ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_and_image_resolves(page):
    broken = broken_links(page)
    assert not broken, f"{page.relative_to(ROOT)}:\n" + "\n".join(broken)


def test_the_readme_is_a_front_page():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines; the rest belongs on a page of docs/"
    first_block = "\n".join(lines[:8])
    assert "make demo" in first_block and "make test" in first_block, "the two commands come first"


def test_every_command_is_in_the_reference():
    """A command added to `tpsim` (or to the generator's list) without a section of the reference fails here."""
    from tpsim.cli import COMMANDS
    documented = set(cli_reference.COMMANDS) | set(cli_reference.USAGE_TEXTS)
    missing = [f"tpsim {name}" for name in COMMANDS if f"tpsim {name}" not in documented]
    assert not missing, f"add to docs/cli_reference.py's COMMANDS: {missing}"
    page = (DOCS / "reference" / "commands.md").read_text()
    markers = set(cli_reference.MARKER.findall(page))
    assert documented == markers, (f"docs/reference/commands.md markers {sorted(markers)} "
                                   f"vs commands {sorted(documented)}")


@pytest.fixture(scope="module")
def built_site(tmp_path_factory):
    out = tmp_path_factory.mktemp("html")
    r = subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", str(DOCS), str(out)],
                       cwd=ROOT, capture_output=True, text=True, timeout=280)
    assert r.returncode == 0, f"sphinx -W failed ({r.returncode}):\n{r.stdout}\n{r.stderr}"
    return out


@pytest.mark.slow
@needs_docs_tools
def test_the_site_builds_without_a_warning(built_site):
    for page in PAGES + lesson_pages():
        name = page.relative_to(DOCS).with_suffix(".html")
        assert (built_site / name).is_file(), f"{name} was not built (is {page.relative_to(ROOT)} in a toctree?)"


@pytest.mark.slow
@needs_docs_tools
def test_every_cli_option_is_in_the_built_reference(built_site):
    text = html.unescape(re.sub(r"<[^>]+>", "", (built_site / "reference" / "commands.html").read_text()))
    missing = [f"{name}: {option}" for name in cli_reference.COMMANDS
               for option in cli_reference.options(cli_reference.parser_of(name))
               if not re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", text)]
    assert not missing, "options missing from the command reference:\n" + "\n".join(missing)


def lesson_pages() -> list[Path]:
    return sorted(GENERATED.glob("*.md"))


@pytest.mark.slow
@needs_docs_tools
def test_every_lesson_has_a_page_whose_links_and_images_resolve(built_site):
    from tpsim.teach.lessons import discover

    assert [p.stem for p in lesson_pages()] == [info.path.stem for info in discover()]
    broken = [f"{page.relative_to(ROOT)}: {problem}" for page in lesson_pages() for problem in broken_links(page)]
    assert not broken, "\n".join(broken)


HTML_LINK = re.compile(r'<(?:a|link|img|script)\b[^>]*?\b(?:href|src)="([^"]+)"')


@pytest.mark.slow
@needs_docs_tools
def test_every_link_of_the_built_site_resolves(built_site):
    """What a reader clicks on the site (the generated pages, the API pages, the theme's own links): every
    relative link and image leads to a file of the site, and every #anchor to an id on its page."""
    ids: dict[Path, set[str]] = {}
    broken = []
    for page in sorted(p for p in built_site.rglob("*.html") if "_static" not in p.parts):  # (theme templates)
        for target in map(html.unescape, HTML_LINK.findall(page.read_text())):
            parts = urlsplit(target)
            if parts.scheme or parts.netloc:  # https:, mailto:, //cdn...
                continue
            file_part, anchor = unquote(parts.path), parts.fragment
            dest = (page.parent / file_part).resolve() if file_part else page
            if not dest.exists():
                broken.append(f"{page.relative_to(built_site)}: {target} (no such file)")
            elif anchor and dest.suffix == ".html":
                if dest not in ids:
                    ids[dest] = set(re.findall(r'\bid="([^"]+)"', dest.read_text()))
                if anchor not in ids[dest]:
                    broken.append(f"{page.relative_to(built_site)}: {target} (no id {anchor!r} there)")
    assert not broken, "\n".join(broken)
