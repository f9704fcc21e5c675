"""Every YAML a command loads is read through one bounded reader (``configs.yamlfile``).

An alias bomb, an alias inside its own anchor, a document nested past the depth bound, more
values than the node bound or a file past the byte bound each fail as one line naming the
file, from every command that loads a config, as typed; a config that uses anchors, aliases
and merge keys the way hand-written configs do loads as before, with each alias a copy of its
own. No module of the package parses YAML any other way.
"""

from __future__ import annotations

import ast
import subprocess

import pytest
from config_walk import PACKAGES, ROOT
from test_cli import streamrl

from streamrl.configs import ConfigError, load_config, parse_overrides, yamlfile


def _bomb(levels: int = 9) -> str:
    """The classic billion laughs: each level nine aliases of the one before (9^9 values)."""
    lines = ["a: &a [x, x, x, x, x, x, x, x, x]"]
    for prev, name in zip("abcdefgh", "bcdefghi"[: levels - 1], strict=False):
        lines.append(f"{name}: &{name} [{', '.join([f'*{prev}'] * 9)}]")
    return "\n".join(lines) + "\n"


def _one_line_naming(done: subprocess.CompletedProcess, name: str, why: str) -> None:
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert name in lines[0] and why in lines[0], lines[0]
    assert "Traceback" not in done.stderr


@pytest.mark.timeout(600)
def test_an_alias_bomb_fails_in_one_line_naming_the_file_from_every_command_that_loads_yaml(
    tmp_path,
):
    bomb = tmp_path / "laughs.yaml"
    bomb.write_text(_bomb())
    assert len(bomb.read_bytes()) < 400
    run_dir = tmp_path / "a-run"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text(_bomb())
    commands = [
        ("config", "convert", "--from", "trl", str(bomb)),
        ("config", "convert", "--from", "verl", str(bomb)),
        ("config", "convert", "--from", "trl", "other.yaml", "--base", str(bomb)),
        ("config", "show", "--config", str(bomb)),
        ("config", "show", "--config", str(run_dir)),
        ("run", "--config", str(bomb)),
    ]
    (tmp_path / "other.yaml").write_text("learning_rate: 1.0e-6\n")
    for args in commands:
        where = str(run_dir / "config.yaml") if str(run_dir) in args else str(bomb)
        why = f"refused: aliases expand it past {yamlfile.MAX_NODES} values"
        _one_line_naming(streamrl(*args, cwd=tmp_path), where, why)


@pytest.mark.timeout(300)
def test_an_alias_inside_its_own_anchor_fails_cleanly_not_with_a_recursion_error(tmp_path):
    selfref = tmp_path / "self.yaml"
    selfref.write_text("learner:\n  lr: 1.0e-6\na: &a [*a]\n")
    _one_line_naming(
        streamrl("config", "convert", "--from", "trl", str(selfref), cwd=tmp_path),
        str(selfref),
        "an alias used inside its own anchor",
    )
    merged = tmp_path / "merge.yaml"
    merged.write_text("learner: &l\n  lr: 1.0e-6\n  <<: *l\n")
    with pytest.raises(ConfigError, match=r"merge\.yaml: refused: an alias used inside its own"):
        load_config(merged, env={})


def test_a_bomb_in_an_override_value_is_refused_naming_the_override():
    flow = "{" + ", ".join(_bomb().strip().splitlines()) + "}"
    with pytest.raises(ConfigError, match=r"^override run\.name: .*aliases expand it past"):
        parse_overrides([f"run.name={flow}"])


def test_anchors_aliases_and_merge_keys_of_a_hand_written_config_load_each_a_copy_of_its_own(
    tmp_path,
):
    path = tmp_path / "anchors.yaml"
    path.write_text(
        "reward:\n"
        "  functions:\n"
        "    - {fn: exact_match, kwargs: &kw {strip: true}}\n"
        "    - {fn: math, kwargs: *kw, weight: 0.5}\n"
        "    - {fn: gsm8k, kwargs: {<<: *kw, extra: 1}}\n"
        "data: {path: &p prompts.jsonl, eval_path: *p}\n"
    )
    cfg = load_config(path, env={})
    first, second, third = (f.kwargs for f in cfg.reward.functions)
    assert first == second == {"strip": True} and third == {"strip": True, "extra": 1}
    assert cfg.data.eval_path == cfg.data.path == "prompts.jsonl"
    tree = yamlfile.parse_mapping(path.read_text(), str(path))
    first, second, _ = (f["kwargs"] for f in tree["reward"]["functions"])
    # a consumer that changes one use of an alias does not change the other
    assert first == second and first is not second


def test_nesting_past_the_depth_bound_is_refused_in_one_line_not_a_recursion_error(tmp_path):
    deep = tmp_path / "deep.yaml"
    deep.write_text("a: " + "[" * 5000 + "]" * 5000 + "\n")
    with pytest.raises(ConfigError, match=r"deep\.yaml: refused: nested deeper than 50 levels"):
        load_config(deep, env={})
    # within the bound of the text, past it through aliases
    chain = ["l0: &l0 [x]"] + [f"l{i}: &l{i} [[[[[*l{i - 1}]]]]]" for i in range(1, 12)]
    (tmp_path / "chain.yaml").write_text("\n".join(chain) + "\n")
    with pytest.raises(ConfigError, match=r"chain\.yaml: refused: aliases nest it deeper"):
        load_config(tmp_path / "chain.yaml", env={})


def test_more_values_than_the_node_bound_or_bytes_than_the_byte_bound_are_refused(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(yamlfile, "MAX_NODES", 1000)
    wide = tmp_path / "wide.yaml"
    wide.write_text("a: [" + ", ".join(["1"] * 1001) + "]\n")
    with pytest.raises(ConfigError, match=r"wide\.yaml: refused: more than 1000 values"):
        load_config(wide, env={})
    big = tmp_path / "big.yaml"
    big.write_text("# " + "x" * yamlfile.MAX_BYTES + "\n")
    with pytest.raises(ConfigError, match=r"big\.yaml: refused: larger than 1 MiB"):
        load_config(big, env={})


def test_not_valid_yaml_is_one_line_without_a_snippet_of_the_text(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("broker:\n  password: 'hunter2\n")
    with pytest.raises(ConfigError) as caught:
        load_config(bad, env={})
    assert str(caught.value).startswith(f"config file {bad}: not valid YAML: ")
    assert "\n" not in str(caught.value) and "hunter2" not in str(caught.value)


def test_no_module_of_the_package_parses_yaml_but_the_bounded_reader():
    """yaml.safe_load & co. build a document's aliases unbounded: only configs/yamlfile.py
    composes YAML, every other reader calls it."""
    parsers = {"load", "safe_load", "full_load", "unsafe_load", "load_all", "safe_load_all",
               "compose", "compose_all", "parse", "scan"}  # fmt: skip
    offenders = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = str(path.relative_to(ROOT))
            if rel == "configs/yamlfile.py":
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if (
                    isinstance(node, ast.Attribute)
                    and isinstance(node.value, ast.Name)
                    and node.value.id == "yaml"
                    and (node.attr in parsers or "Loader" in node.attr)
                ):
                    offenders.append(f"{rel}:{node.lineno} yaml.{node.attr}")
    assert offenders == []
