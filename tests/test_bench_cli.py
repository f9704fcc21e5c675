"""bench.cli: the quoted command line and the section every benchmark command writes."""

from __future__ import annotations

from bench.cli import command_line, publish


def test_the_command_line_quotes_only_arguments_with_a_space():
    argv = ["--seeds", "0,1", "pi prox=algo.proximal=behaviour", "preset="]
    assert (
        command_line("bench.variants", argv)
        == 'python -m bench.variants --seeds 0,1 "pi prox=algo.proximal=behaviour" preset='
    )
    assert command_line("bench.system", []) == "python -m bench.system"


def test_publish_writes_the_section_where_the_page_reads_it_and_shows_it(tmp_path, capsys):
    section = tmp_path / "docs" / "bench" / "part.md"
    publish(section, "## Part\n")
    assert section.read_text() == "## Part\n"
    assert "## Part" in capsys.readouterr().out
