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


def test_the_readmes_package_table_and_the_architecture_map_name_every_package():
    """Every folder pyproject.toml maps into ``streamrl`` has a row in the README's table and a
    place in docs/architecture.md's map, and neither names a package that is not there."""
    # pyproject's [tool.setuptools.package-dir] lines (no tomllib: Python 3.10 lacks it)
    pyproject = (ROOT / "pyproject.toml").read_text()
    mapping = pyproject.split("[tool.setuptools.package-dir]", 1)[1].split("\n[", 1)[0]
    folders = {f"{folder}/" for folder in re.findall(r'^"[\w.]+" = "(\w+)"$', mapping, re.M)}
    table = set(re.findall(r"^\| `(\w+/)` \|", README.read_text(), re.M))
    architecture = (ROOT / "docs/architecture.md").read_text()
    picture = architecture.split("## The map", 1)[1].split("```")[1]
    drawn = set(re.findall(r"(?:^|\s)(\w+/)(?=\s)", picture))
    assert table == folders
    assert folders <= drawn
