"""The README fits on a screen and leads to every page; the site's navigation holds every page.

The documentation site itself is built by ``mkdocs build --strict`` in ``.ci/run`` (broken links
and anchors fail it there); these checks need no mkdocs.
"""

from __future__ import annotations

import re
from pathlib import Path

import zett_agent

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = sorted(p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md"))
MAX_README_LINES = 250

_LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)\s]*)?\)")


def test_the_readme_fits_on_a_screen() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= MAX_README_LINES, f"README.md has {len(lines)} lines"


def test_the_readme_starts_with_the_two_commands() -> None:
    text = README.read_text(encoding="utf-8")
    assert text.startswith("# zett_agent\n\n```\nuv run zett-agent demo\nuv run pytest\n```\n")
    for requirement in ("Linux", "Python 3.11+", "uv"):
        assert requirement in text


def test_the_readme_links_every_page_of_the_docs() -> None:
    linked = {
        target.removeprefix("docs/")
        for target in _LINK.findall(README.read_text(encoding="utf-8"))
        if target.startswith("docs/")
    }
    assert set(PAGES) - linked == set()
    assert linked - set(PAGES) == set(), "the README links a page that does not exist"


def test_the_readme_tells_no_history() -> None:
    text = README.read_text(encoding="utf-8").lower()
    for word in (r"\bbefore\b", r"\bnow\b", r"\bno longer\b", r"\bused to\b", r"\bwave \d"):
        assert not re.search(word, text), f"README.md says {word!r}: history goes to CHANGELOG.md"


def test_the_site_navigation_holds_every_page() -> None:
    config = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    nav = set(re.findall(r"^\s*- (?:[^:\n]+: )?([\w/.-]+\.md)\s*$", config, re.MULTILINE))
    assert nav == set(PAGES)


def test_the_api_reference_names_what_a_first_program_imports() -> None:
    index = (DOCS / "api" / "index.md").read_text(encoding="utf-8")
    missing = [n for n in zett_agent.__all__ if n != "__version__" and f"`{n}`" not in index]
    assert missing == [], "docs/api/index.md does not list these names of zett_agent.__all__"


def test_the_changelog_keeps_a_changelog() -> None:
    text = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    assert text.startswith("# Changelog\n")
    assert "## [Unreleased]" in text
    assert (DOCS / "changelog.md").read_text(encoding="utf-8").strip() == '--8<-- "CHANGELOG.md"'


def test_the_internals_page_names_every_private_module_with_its_concept() -> None:
    """docs/internals.md has one row per private module: the map a newcomer reads first."""
    page = (DOCS / "internals.md").read_text(encoding="utf-8")
    listed = set(re.findall(r"^\| `(_\w+)` \| \S", page, flags=re.MULTILINE))
    modules = {
        path.stem
        for path in (ROOT / "src" / "zett_agent").rglob("_*.py")
        if not path.name.startswith("__")
    }
    assert sorted(modules - listed) == [], "private modules missing from docs/internals.md"
    assert sorted(listed - modules) == [], "docs/internals.md lists modules that do not exist"
