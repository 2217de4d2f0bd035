"""Every relative link in the READMEs and docs/*.md points at a file that exists, and a
``#fragment`` into a Markdown file at one of its headings (GitHub's anchor rules)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Dict, List, Set, Tuple

from conftest import REPO

# docs/incident-readme-section.md is generated for README.md (scripts/incident_report.py):
# its links are relative to the repository root, where it is pasted.
DOCS: List[Tuple[Path, Path]] = [
    (REPO / "README.md", REPO),
    (REPO / "python" / "README.md", REPO / "python"),
    (REPO / "client" / "README.md", REPO / "client"),
    (REPO / "provider" / "README.md", REPO / "provider"),
    (REPO / "docs" / "incident-readme-section.md", REPO),
] + [
    (p, p.parent)
    for p in sorted((REPO / "docs").glob("*.md"))
    if p.name != "incident-readme-section.md"
]

FENCE = re.compile(r"^```.*?^```", re.S | re.M)
LINK = re.compile(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to dashes."""
    text = heading.replace("`", "").strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> Set[str]:
    seen: Dict[str, int] = {}
    out = set()
    for m in re.finditer(r"^#+\s+(.*)$", FENCE.sub("", path.read_text()), re.M):
        s = slug(m.group(1))
        n = seen.get(s, 0)
        seen[s] = n + 1
        out.add(s if n == 0 else f"{s}-{n}")
    return out


def broken_links(doc: Path, base: Path) -> List[str]:
    bad = []
    for m in LINK.finditer(FENCE.sub("", doc.read_text())):
        target = m.group(1)
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path, _, fragment = target.partition("#")
        resolved = (base / path).resolve() if path else doc
        if not resolved.exists():
            bad.append(f"{target}: no such file")
        elif fragment and resolved.suffix == ".md" and fragment not in anchors(resolved):
            bad.append(f"{target}: no heading #{fragment} in {resolved.name}")
    return bad


def test_slug_follows_github() -> None:
    assert slug("What a client guarantees under cancellation, errors and outages") == (
        "what-a-client-guarantees-under-cancellation-errors-and-outages"
    )
    assert slug("2. Only outages go to the failure policy") == (
        "2-only-outages-go-to-the-failure-policy"
    )
    assert slug("One call per request: `Limiter`") == "one-call-per-request-limiter"


def test_the_checker_finds_a_broken_link(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# Title here\n")
    doc = tmp_path / "doc.md"
    doc.write_text(
        "[ok](other.md#title-here) [gone](nope.md) [anchor](other.md#nope)\n"
        "```\n[in a fence](ignored.md)\n```\n[web](https://example.com/x)\n"
    )
    assert broken_links(doc, tmp_path) == [
        "nope.md: no such file",
        "other.md#nope: no heading #nope in other.md",
    ]


def test_every_relative_link_resolves() -> None:
    bad = {str(doc.relative_to(REPO)): broken_links(doc, base) for doc, base in DOCS}
    assert {doc: links for doc, links in bad.items() if links} == {}
