"""The README and docs/: a short README that lists every option and links every docs page, links
that resolve (files and #anchors), and no wording after working sessions."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from wrapgen.config import OPTIONS

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.glob("*.md"))
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return {slug(m.group(1)) for m in re.finditer(r"^#+ (.+)$", text, re.M)}


def links(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    text = re.sub(r"`[^`\n]*`", "", text)  # code spans: `wrap_triton(kernel)[grid](...)` is no link
    return [m.group(1) for m in LINK.finditer(text) if not re.match(r"[a-z]+:", m.group(1))]


def test_readme_is_short() -> None:
    assert len(README.read_text().splitlines()) <= 250


def test_readme_options_table_has_every_option_on_one_line() -> None:
    rows = {}
    for line in README.read_text().splitlines():
        match = re.match(r"\| `(\w+)` \| `(WRAPGEN_\w+)` \|", line)
        if match:
            rows[match.group(1)] = (match.group(2), line)
    assert set(rows) == set(OPTIONS), "the README's options table lists exactly wrapgen.config.OPTIONS"
    for name, option in OPTIONS.items():
        env, line = rows[name]
        assert env == option.env
        assert len(line.split("|")) == 6, f"{name}: one row of four cells"


def test_docs_index_names_the_page_of_every_option() -> None:
    index = (DOCS / "README.md").read_text()
    for name in OPTIONS:
        assert re.search(rf"^\|[^\n]*`{name}`[^\n]*\| \[", index, re.M), f"docs/README.md: no page for {name}"


def test_readme_links_every_docs_page() -> None:
    linked = {(README.parent / target.split("#")[0]).resolve() for target in links(README)}
    assert PAGES and all(page.resolve() in linked for page in PAGES), "README links every docs/ page"


@pytest.mark.parametrize("page", [README, *PAGES], ids=lambda p: str(p.relative_to(ROOT)))
def test_links_resolve(page: Path) -> None:
    for target in links(page):
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        assert resolved.exists(), f"{page.name}: {target} does not exist"
        results = (ROOT / "benchmarks" / "results").resolve()
        if results in resolved.parents:
            # result files are renamed as they are superseded: link the index, never one file
            assert resolved == results / "README.md", f"{page.name}: link {target} to the results index"
        if anchor:
            assert anchor in anchors(resolved), f"{page.name}: no heading for #{anchor} in {resolved.name}"


@pytest.mark.parametrize("page", [README, *PAGES], ids=lambda p: str(p.relative_to(ROOT)))
def test_no_session_wording(page: Path) -> None:
    text = page.read_text()
    assert not re.search(r"\bsessions?\b", text, re.I), f"{page.name} speaks of sessions"
    assert not re.search(r"-s\d+\b", text), f"{page.name} names a file after a session"
