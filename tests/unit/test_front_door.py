"""The front door: a newcomer finds the two commands and the map on the README's first screen, every relative link
in the docs resolves, and no test talks to an address outside this machine."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LINK = re.compile(r"\[[^\]]*\]\(([^)#\s]+)(?:#[^)]*)?\)")


def test_readme_first_screen_has_the_two_commands_and_links_the_architecture():
    lines = (REPO / "README.md").read_text().splitlines()
    first40 = "\n".join(lines[:40])
    assert "make demo" in first40 and "make test" in first40
    assert any("docs/architecture.md" in target for target in LINK.findall("\n".join(lines[:60])))


def test_virtual_has_a_readme_that_says_what_it_cannot_prove():
    text = (REPO / "virtual" / "README.md").read_text()
    assert "../docs/architecture.md" in LINK.findall(text)
    assert re.search(r"(?i)not|cannot", text)


def test_every_relative_markdown_link_resolves():
    broken = []
    for doc in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), REPO / "virtual" / "README.md",
                REPO / "ansible" / "README.md"]:
        for target in LINK.findall(doc.read_text()):
            if "://" in target or target.startswith("mailto:"):
                continue
            if not (doc.parent / target).exists():
                broken.append(f"{doc.relative_to(REPO)} -> {target}")
    assert broken == []


def test_tests_name_no_address_outside_this_machine_as_unreachable():
    """An "unreachable" host in a test is a loopback address on a closed port: the documentation ranges
    (192.0.2.0/24, 198.51.100.0/24, 203.0.113.0/24) are this machine's real link network here."""
    ranges = re.compile(r"\b(192\.0\.2|198\.51\.100|203\.0\.113)\.\d+")
    found = [f"{p.relative_to(REPO)}" for p in sorted((REPO / "tests").rglob("*.py"))
             if p.name != Path(__file__).name and ranges.search(p.read_text(errors="replace"))]
    assert found == []
