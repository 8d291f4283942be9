"""Every relative link of README.md and docs/*.md leads somewhere: to a file or folder of the
repository, and, with a `#fragment`, to a heading of that markdown page (GitHub's anchors)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
#: `[text](target)`, not an image's `![...]`; the target ends at whitespace or `)`.
LINK = re.compile(r"(?<!!)\[[^\]\n]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)


def pages() -> list[Path]:
    return [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, markup and punctuation dropped, spaces to '-'."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    return {anchor(h) for h in re.findall(r"^#{1,6} (.+)$", text, flags=re.M)}


def broken_links(page: Path, root: Path = REPO_ROOT) -> list[str]:
    """`page: target (why)` for each relative link of `page` that leads nowhere (or out of `root`)."""
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    bad = []
    for target in LINK.findall(text):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:: not a file of the repo
            continue
        path, _, fragment = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists() or root.resolve() not in (resolved, *resolved.parents):
            bad.append(f"{page.name}: {target} (no such file in the repository)")
        elif fragment and (resolved.suffix != ".md" or fragment not in anchors(resolved)):
            bad.append(f"{page.name}: {target} (no heading #{fragment} there)")
    return bad


def test_the_anchor_rule_is_githubs():
    assert anchor("Production check: counterfactory doctor") == "production-check-counterfactory-doctor"
    assert anchor("What happens when…") == "what-happens-when"
    assert anchor("The `counterfactory` command") == "the-counterfactory-command"
    assert anchor("1. Build a dataset") == "1-build-a-dataset"


def test_the_link_check_finds_a_broken_link(tmp_path):
    page = tmp_path / "page.md"
    (tmp_path / "other.md").write_text("# Other\n\n## A heading\n")
    page.write_text(
        "# P\n\n[ok](other.md) [ok](other.md#a-heading) [ok](#p) [web](https://x.org/y)\n"
        "![img](missing.png)\n"
        "```text\n[in a block](nowhere.md)\n```\n"
        "[gone](missing.md) [no anchor](other.md#nothing)\n"
    )
    assert broken_links(page, tmp_path) == [
        "page.md: missing.md (no such file in the repository)",
        "page.md: other.md#nothing (no heading #nothing there)",
    ]


def test_readme_and_docs_have_links_to_check():
    assert len(pages()) >= 8
    assert sum(len(LINK.findall(p.read_text(encoding="utf-8"))) for p in pages()) >= 20


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_every_relative_link_resolves(page):
    assert not broken_links(page), "\n".join(broken_links(page))
