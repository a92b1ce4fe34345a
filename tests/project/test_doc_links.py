"""Every relative link in README.md, CHANGELOG.md and docs/*.md reaches a file that exists and, with a #fragment,
a heading of that file (GitHub's anchors), so moving a section between pages cannot leave a dead link behind. No
network: links with a scheme (https:, mailto:) are not followed. docs/operations.md quotes every alert's runbook
as the rules files have it."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).parent.parent.parent
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [ROOT / "README.md", ROOT / "CHANGELOG.md", *DOCS]

FENCE = re.compile(r"^ {0,3}(```|~~~)")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
INLINE_CODE = re.compile(r"(`+).*?\1")
LINK = re.compile(r"\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^()\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def prose(text: str) -> list[tuple[int, str]]:
    """The lines of a Markdown text outside fenced code blocks, with their numbers."""
    lines, fenced = [], None
    for number, line in enumerate(text.splitlines(), 1):
        opening = FENCE.match(line)
        if opening and (fenced is None or opening.group(1) == fenced):
            fenced = opening.group(1) if fenced is None else None
            continue
        if fenced is None:
            lines.append((number, line))
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: the text as rendered (code spans keep their text, links their label),
    lower-cased, punctuation dropped except '-' and '_', each space a hyphen."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text.lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every anchor the headings of a page give, a repeated one numbered as GitHub numbers it (-1, -2 ...)."""
    found: set[str] = set()
    counts: dict[str, int] = {}
    for _, line in prose(page.read_text()):
        heading = HEADING.match(line)
        if heading:
            base = slug(heading.group(2))
            found.add(base if base not in counts else f"{base}-{counts[base]}")
            counts[base] = counts.get(base, 0) + 1
    return found


def broken_links(page: Path, root: Path = ROOT) -> list[str]:
    """The relative links of a page that lead nowhere, each as 'page:line: target (why)'."""
    broken = []
    for number, line in prose(page.read_text()):
        for target in LINK.findall(INLINE_CODE.sub("", line)):
            if not target or SCHEME.match(target) or target.startswith("//"):
                continue
            path, _, fragment = target.partition("#")
            where = (page.parent / unquote(path)).resolve() if path else page
            shown = f"{page.relative_to(root).as_posix()}:{number}: {target}"
            if not where.exists():
                broken.append(f"{shown} (no such file)")
            elif fragment and (where.is_dir() or where.suffix != ".md"):
                broken.append(f"{shown} (an anchor into a file that is not Markdown)")
            elif fragment and unquote(fragment) not in anchors(where):
                broken.append(f"{shown} (no such heading)")
    return broken


@pytest.mark.parametrize("page", PAGES, ids=[page.relative_to(ROOT).as_posix() for page in PAGES])
def test_every_relative_link_reaches_a_file_and_heading(page: Path) -> None:
    """Each relative link of the page names a file that exists and, with a #fragment, one of its headings."""
    assert broken_links(page) == []


def test_the_docs_pages_are_linked_from_the_readme() -> None:
    """The README is the way in: every page under docs/ is linked from it."""
    readme = (ROOT / "README.md").read_text()
    for page in DOCS:
        assert f"](docs/{page.name}" in readme, page.name
    assert "](CHANGELOG.md)" in readme


def test_the_checker_finds_dead_files_and_anchors(tmp_path: Path) -> None:
    """The checker itself: a missing file, a missing heading, a heading of another page, an anchor into a folder
    are reported; good links (to a file, a folder, a heading here or elsewhere, a repeated heading, a heading with
    code and punctuation), links in code, and links with a scheme are not."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "other.md").write_text("# Other\n\n## Fleet view: `se-exporter fleet`\n\n## Same\n\n## Same\n")
    page = tmp_path / "README.md"
    page.write_text(
        "# Title\n\n### AKS's node-problem-detector\n\n"
        "[ok](docs/other.md) [ok](docs) [ok](#akss-node-problem-detector) [ok](docs/other.md#same-1)\n"
        "[ok](docs/other.md#fleet-view-se-exporter-fleet) [web](https://example.invalid/x#y) `[code](missing.md)`\n"
        "```\n[fenced](missing.md)\n```\n"
        "[gone](docs/missing.md) [nohead](#nowhere) [elsewhere](docs/other.md#title) [dir](docs#x)\n")

    assert broken_links(page, tmp_path) == [
        "README.md:10: docs/missing.md (no such file)",
        "README.md:10: #nowhere (no such heading)",
        "README.md:10: docs/other.md#title (no such heading)",
        "README.md:10: docs#x (an anchor into a file that is not Markdown)",
    ]
