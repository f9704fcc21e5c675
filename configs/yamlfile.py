"""The one YAML reader of every config a command loads: bounded in bytes, nodes and depth.

A safe loader alone is not enough: PyYAML composes an alias as a reference to its anchor's
node, so 300 bytes of nested aliases (the "billion laughs") make a tree of 10^8 values once
anything walks it, and ``a: &a [*a]`` makes a list that contains itself. Here every alias
counts as the whole subtree it stands for, and a document refuses past ``MAX_NODES`` values,
``MAX_DEPTH`` levels or ``MAX_BYTES`` of text, and any alias inside its own anchor; what it
returns is a plain tree (dicts, lists, scalars) with no object reachable twice, so whatever
walks, copies or mutates it costs what the count says. Anchors used a few times, and merge
keys (``<<: *defaults``), load as before. Imports ``errors`` only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from streamrl.configs.errors import ConfigError

# a complete streamrl config (every default spelled out, as a run directory saves it) is 442
# values in 4.3 kB, TRL's GRPOConfig 193; the pure-Python parser takes about a second per
# 20,000 values or per MiB on one busy core, so this is what a refused file may cost
MAX_NODES = 20_000
MAX_BYTES = 1024 * 1024
# a config nests a handful of levels (section, kwargs mapping, a list in it)
MAX_DEPTH = 50


class _Refused(Exception):
    """Why a document is refused; the caller names the file."""


class _Loader(yaml.SafeLoader):
    """SafeLoader that stops composing past MAX_DEPTH levels or MAX_NODES nodes."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._composed = 0

    def compose_node(self, parent, index):
        self._depth += 1
        self._composed += 1
        try:
            if self._depth > MAX_DEPTH:
                raise _Refused(f"nested deeper than {MAX_DEPTH} levels{_at(self.peek_event())}")
            if self._composed > MAX_NODES:
                raise _Refused(f"more than {MAX_NODES} values")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def _at(item: Any) -> str:
    mark = getattr(item, "start_mark", None) or getattr(item, "problem_mark", None)
    return f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def _measure(node: yaml.Node, depth: int, open_: set[int], seen: dict[int, tuple[int, int]]):
    """(values, levels) of ``node`` with every alias expanded; each node is measured once, so
    this costs the composed document's size, however large the expansion."""
    if depth > MAX_DEPTH:
        raise _Refused(f"aliases nest it deeper than {MAX_DEPTH} levels{_at(node)}")
    if id(node) in open_:
        raise _Refused(f"an alias used inside its own anchor{_at(node)}")
    if id(node) not in seen:
        open_.add(id(node))
        size, height = 1, 0
        for child in _children(node):
            child_size, child_height = _measure(child, depth + 1, open_, seen)
            size, height = size + child_size, max(height, child_height + 1)
            if size > MAX_NODES:
                raise _Refused(f"aliases expand it past {MAX_NODES} values{_at(node)}")
        open_.discard(id(node))
        seen[id(node)] = (size, height)
    size, height = seen[id(node)]
    if depth + height > MAX_DEPTH:
        raise _Refused(f"aliases nest it deeper than {MAX_DEPTH} levels{_at(node)}")
    return size, height


def _unshared(value: Any) -> Any:
    """A copy of the constructed tree in which an aliased subtree is a separate copy per use."""
    if isinstance(value, dict):
        return {key: _unshared(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_unshared(item) for item in value]
    return value


def parse(text: str, source: str) -> Any:
    """The YAML document ``text`` as a plain tree; ConfigError ``"<source>: <why>"`` (one line)
    when it is not YAML or is past the bounds above."""
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _measure(node, 1, set(), {})
        return _unshared(loader.construct_document(node))
    except _Refused as why:
        raise ConfigError(f"{source}: refused: {why}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: not valid YAML: {_problem(exc)}") from None
    finally:
        loader.dispose()


def _problem(exc: yaml.YAMLError) -> str:
    """PyYAML's reason on one line, without the snippet of the text it quotes (it may be a
    secret)."""
    if not isinstance(exc, yaml.MarkedYAMLError):
        return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    words = ", ".join(part for part in (exc.context, exc.problem) if part)
    return (words or "not YAML") + _at(exc)


def parse_mapping(text: str, source: str) -> dict[str, Any]:
    """``parse``, an empty document as ``{}``; ConfigError unless the top level is a mapping."""
    tree = parse(text, source)
    if tree is None:
        return {}
    if not isinstance(tree, dict):
        raise ConfigError(f"{source}: top level must be a mapping, got {type(tree).__name__}")
    return tree


def read_text(path: Path, source: str) -> str:
    """The text of ``path``, at most MAX_BYTES of it; ConfigError ``"<source>: <why>"``."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"{source}: {exc.strerror}") from None
    if len(raw) > MAX_BYTES:
        raise ConfigError(f"{source}: refused: larger than {MAX_BYTES // 2**20} MiB")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{source}: not UTF-8 text (byte {exc.start})") from None
