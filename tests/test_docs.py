"""The README is a front door and the rest lives in docs/, built by MkDocs in strict mode.

MkDocs checks links between the pages (a missing page or anchor fails a strict build); it never reads
the README, so the README's own links into docs/ are checked here. The build tests skip where MkDocs is
not installed (it comes with the `dev` extra).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
DOCS = ROOT / "docs"
README_MAX_LINES = 300


def _nav_pages() -> list[str]:
    """The pages mkdocs.yml's nav lists (`- Title: page.md`), read without YAML."""
    text = (ROOT / "mkdocs.yml").read_text()
    nav = text.split("\nnav:\n", 1)[1]
    return re.findall(r"^\s+- [^:\n]+:\s*(\S+\.md)\s*$", nav, flags=re.MULTILINE)


def _slug(heading: str) -> str:
    """A heading's anchor as Python-Markdown's toc extension (MkDocs' default) makes it."""
    ascii_text = unicodedata.normalize("NFKD", heading).encode("ascii", "ignore").decode("ascii")
    return re.sub(r"[-\s]+", "-", re.sub(r"[^\w\s-]", "", ascii_text).strip().lower())


def _anchors(page: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.MULTILINE | re.DOTALL)
    return {_slug(m) for m in re.findall(r"^#{1,6} (.+?)\s*$", text, flags=re.MULTILINE)}


def _build(project: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_readme_stays_a_front_door() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; move detail into docs/"


def test_the_readme_keeps_its_two_set_up_commands_and_ci_runs_them() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "pip install . && perfgate serve\n" in readme
    assert 'pip install -e ".[dev]" && pytest\n' in readme
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert 'pip install -e ".[dev]"' in ci and "pytest" in ci
    assert any(line.startswith("mkdocs build --strict") for line in ci)


def test_every_docs_page_is_in_the_nav_and_every_nav_entry_exists() -> None:
    nav = _nav_pages()
    pages = sorted(p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md"))
    assert sorted(nav) == pages
    assert len(nav) == len(set(nav)), "a page is listed twice"


def test_the_readme_links_into_docs_name_pages_and_headings_that_exist() -> None:
    links = re.findall(r"\]\((docs/[^)#\s]+)(?:#([^)\s]+))?\)", (ROOT / "README.md").read_text())
    assert links, "the README links no docs page"
    for target, anchor in links:
        page = ROOT / target
        assert page.is_file(), f"README links {target}, which does not exist"
        if anchor:
            assert anchor in _anchors(page), f"README links {target}#{anchor}, a heading {target} lacks"


def test_the_gates_page_keeps_the_markers_its_generated_table_goes_between() -> None:
    """The gate table is generated from the gate registry into docs/gates.md, between these two lines."""
    text = (DOCS / "gates.md").read_text()
    start, end = text.find("<!-- gates-table:start -->"), text.find("<!-- gates-table:end -->")
    assert 0 <= start < end, "docs/gates.md lost its gates-table markers"


def test_the_site_builds_in_strict_mode(tmp_path: Path) -> None:
    pytest.importorskip("mkdocs")
    done = _build(ROOT, tmp_path / "site")
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "site" / "gates" / "index.html").is_file()


@pytest.mark.parametrize(
    ("link", "complaint"),
    [
        ("[gone](no-such-page.md)", "no-such-page.md"),
        ("[gone](gates.md#no-such-heading)", "no-such-heading"),
    ],
)
def test_a_broken_link_between_pages_fails_the_build(tmp_path: Path, link: str, complaint: str) -> None:
    pytest.importorskip("mkdocs")
    project = tmp_path / "project"
    shutil.copytree(DOCS, project / "docs")
    shutil.copy(ROOT / "mkdocs.yml", project / "mkdocs.yml")
    page = project / "docs" / "tools.md"
    page.write_text(page.read_text() + f"\nSee {link}.\n")
    done = _build(project, tmp_path / "site")
    assert done.returncode != 0
    assert complaint in done.stdout + done.stderr
