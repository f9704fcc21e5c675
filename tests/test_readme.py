"""The README stays a front page: short enough to read in one sitting, its detail in docs/ behind
links that resolve."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MAX_LINES = 250


def test_the_readme_is_at_most_250_lines():
    lines = len(README.read_text().splitlines())
    assert lines <= MAX_LINES, f"README.md has {lines} lines: move detail into docs/"


def test_every_relative_link_of_the_readme_names_a_file_of_the_repository():
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README.read_text())
    relative = [link for link in links if not re.match(r"\w+://", link)]
    assert relative, "the README links to nothing: the pattern no longer reads it"
    assert [link for link in relative if not (ROOT / link).exists()] == []
