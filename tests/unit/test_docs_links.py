"""Every link in the README and docs/ leads somewhere: a file of the repository, and a
heading of it where the link names one (pages moved out of the README must not leave
links to where they were)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from chaos.docgen.markdown import slug

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").rglob("*.md"))]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.M | re.S)


def headings(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text())
    return {slug(m[1]) for m in re.finditer(r"^#+ (.+)$", text, re.M)}


def broken_links(page: Path) -> list[str]:
    out = []
    for target in LINK.findall(FENCE.sub("", page.read_text())):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            out.append(f"{target}: no {_shown(dest)}")
        elif anchor and dest.suffix == ".md" and anchor not in headings(dest):
            out.append(f"{target}: no heading #{anchor} in {_shown(dest)}")
    return out


def _shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_leads_to_a_file_and_heading_of_the_repository(page):
    assert not broken_links(page), broken_links(page)


def test_a_link_to_a_missing_file_or_heading_is_found(tmp_path):
    (tmp_path / "other.md").write_text("# Other\n\n## A heading\n")
    page = tmp_path / "page.md"
    page.write_text("[ok](other.md#a-heading) [gone](missing.md) [no](other.md#nowhere) [web](https://x.org/a)\n"
                    "```\n[in a fence](ignored.md)\n```\n")
    assert [b.split(":")[0] for b in broken_links(page)] == ["missing.md", "other.md#nowhere"]


def test_fenced_blocks_pair_each_opening_with_its_own_closing():
    from chaos.docgen.markdown import fenced_blocks

    text = "```python\nx = 1\n```\nprose --profile p.yaml\n```\nray-chaos sweep --profile p.yaml\n```\n"
    assert fenced_blocks(text) == [("python", "x = 1\n"), ("", "ray-chaos sweep --profile p.yaml\n")]
