"""docs/benchmarks.md is assembled from docs/bench/*.md: every section, in the page's order."""

from __future__ import annotations

import bench.__main__ as page


def test_the_page_keeps_every_section_in_order(tmp_path, monkeypatch):
    monkeypatch.setattr(page, "PART_DIR", tmp_path / "bench")
    monkeypatch.setattr(page, "OUT", tmp_path / "benchmarks.md")
    page.PART_DIR.mkdir()
    # written by make bench, make bench-vllm, by hand (mutation) and one the page does not name
    for name in ("zeta", "mutation", "chaos", "engines", "actors", "broker"):
        (page.PART_DIR / f"{name}.md").write_text(f"## {name}\n")
    page.write_page()
    text = page.OUT.read_text()
    headings = [line[3:] for line in text.splitlines() if line.startswith("## ")]
    assert headings == ["broker", "actors", "engines", "chaos", "mutation", "zeta"]
