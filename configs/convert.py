"""Translate a TRL ``GRPOConfig`` or a verl config into a streamrl config, field by field.

Every field of the foreign file gets a row: *mapped* (same meaning), *approximated* (the
nearest streamrl setting, and how it differs), *refused* (no counterpart, and why) or *unset*
(null there, so streamrl's default stands). Names resolve through ``foreign.FOREIGN`` (the
map the loader's unknown-key hint uses), then the verl paths whose last part alone is
ambiguous (``actor_rollout_ref.rollout.n``), then a streamrl key of the same unique name
(``temperature``, ``seed``). Each value is checked against the schema on its own: one the
schema rejects is refused with the loader's reason, so the written YAML always loads.

A setting that names code a run would import (``convert_rules.CODE_KEYS``: a plug-in reward, an
environment, ``trust_remote_code``) is a *code reference*: listed first
in the table and written commented out, never live, so a converted config runs nothing the
foreign file named until the user has looked; converting imports nothing either.
May import ``streamrl.configs`` only.
"""

from __future__ import annotations

import functools
import typing
from typing import Any, NamedTuple

import yaml
from pydantic import BaseModel

from streamrl.configs import foreign
from streamrl.configs.convert_rules import (
    NO_COUNTERPART,
    RULES,
    VERL_PATHS,
    WHY_NOT,
    Dialect,
    Refused,
    Setting,
    Status,
    code_in,
)
from streamrl.configs.errors import ConfigError
from streamrl.configs.load import load_config, read_tree
from streamrl.configs.schema import Config


class Row(NamedTuple):
    field: str
    value: Any
    status: Status
    target: str
    note: str
    # a code reference's settings (key, value), which the written config carries only in a comment
    held: tuple[tuple[str, Any], ...] = ()


@functools.cache
def _schema_leaves() -> dict[str, list[str]]:
    """Each leaf name of the schema -> its dotted keys; the SFT/DPO section left out (its
    ``beta``, ``epochs`` and ``shuffle`` mean other things than a GRPO trainer's)."""
    leaves: dict[str, list[str]] = {}

    def walk(model: type[BaseModel], prefix: str) -> None:
        for name, field in model.model_fields.items():
            args = [a for a in typing.get_args(field.annotation) if a is not type(None)]
            inner = args[0] if len(args) == 1 else field.annotation
            if isinstance(inner, type) and issubclass(inner, BaseModel):
                walk(inner, f"{prefix}{name}.")
            else:
                leaves.setdefault(name, []).append(prefix + name)

    for name, field in Config.model_fields.items():
        if name != "supervised":
            walk(field.annotation, f"{name}.")
    return leaves


def target_of(dialect: Dialect, path: str) -> str | None:
    """streamrl's key for a foreign field, or None."""
    leaf = path.rsplit(".", 1)[-1]
    if dialect == "verl" and path in VERL_PATHS:
        return VERL_PATHS[path]
    if leaf in foreign.FOREIGN:
        return foreign.FOREIGN[leaf][1]
    same = _schema_leaves().get(leaf, [])
    return same[0] if len(same) == 1 else None


def _flatten(tree: dict, prefix: str = "") -> dict[str, Any]:
    """Nested mappings -> dotted keys (a file may also spell keys dotted, as verl's CLI does)."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(_flatten(value, f"{path}."))
        else:
            out[path] = value
    return out


def _nest(flat: dict[str, Any], out: dict[str, Any]) -> dict[str, Any]:
    """``out`` with the dotted keys of ``flat`` set in it."""
    for path, value in flat.items():
        node = out
        *parents, leaf = path.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return out


def _settings(dialect: Dialect, path: str, value: Any, tree: dict) -> list[Setting]:
    leaf = path.rsplit(".", 1)[-1]
    rule = RULES[dialect].get(path) or RULES[dialect].get(leaf)
    if rule is not None:
        return rule(value, tree)
    key = target_of(dialect, path)
    if key is None:
        section = next((p for p in path.split(".") if p in WHY_NOT), None)
        raise Refused(WHY_NOT.get(leaf) or WHY_NOT.get(section or "", NO_COUNTERPART))
    return [Setting(key, value)]


def _schema_error(base: str | None, key: str, value: Any) -> str | None:
    """The loader's reason for refusing ``key: value`` on top of ``base``, or None."""
    try:
        load_config(base, {key: value}, env={})
    except ConfigError as exc:
        reasons = [line.strip() for line in str(exc).splitlines()[1:]]
        return "; ".join(reasons) or str(exc)
    return None


def convert(
    tree: dict, dialect: Dialect, base: str | None = None
) -> tuple[dict[str, Any], list[Row]]:
    """(streamrl's settings, dotted, each checked against the schema on top of ``base``; the
    rows). Two fields that set one key to different values: the first one wins, the other is
    refused naming it. A code reference's settings are in its row (``Row.held``), not in the
    settings. ConfigError when the settings pass one by one but not together."""
    if dialect not in RULES:
        raise ConfigError(f"--from {dialect}: trl or verl")
    settings: dict[str, Any] = {}
    set_by: dict[str, str] = {}
    checked: dict[tuple[str, str], str | None] = {}
    rows: list[Row] = []
    for path, value in _flatten(tree).items():
        if value is None:
            rows.append(Row(path, value, "unset", "", "null: streamrl's default stands"))
            continue
        try:
            made = _settings(dialect, path, value, tree)
        except Refused as why:
            rows.append(Row(path, value, "refused", "", str(why)))
            continue
        problems = []
        for s in made:
            if s.key is None:
                continue
            if s.key in settings and settings[s.key] != s.value:
                problems.append(f"{s.key} already {settings[s.key]!r} from {set_by[s.key]}")
                continue
            # many fields may name one key with one value: the loader checks each pair once; a
            # code reference is checked on its own (it replaces what the base names, e.g. the
            # rewards its target_parts refer to, only once the user sets it)
            pair = (s.key, repr(s.value))
            if pair not in checked:
                on = None if code_in(s.key, s.value) else base
                checked[pair] = _schema_error(on, s.key, s.value)
            if checked[pair] is not None:
                problems.append(checked[pair])
        if problems:
            rows.append(Row(path, value, "refused", "", "; ".join(problems)))
            continue
        for s in made:
            if s.key is not None:
                settings[s.key] = s.value
                set_by.setdefault(s.key, path)
        rows.append(_row(path, value, made))
    for row in rows:
        for key, _ in row.held:
            settings.pop(key, None)
    # each value passed on its own; one that only fails beside another (a cross-key rule) is named
    load_config(base, settings, env={})
    return settings, rows


def _row(path: str, value: Any, made: list[Setting]) -> Row:
    targets = ", ".join(f"{s.key}={s.value!r}" for s in made if s.key) or "-"
    notes = [s.note for s in made if s.note]
    held = tuple((s.key, s.value) for s in made if s.key and code_in(s.key, s.value))
    if held:
        refs = ", ".join(dict.fromkeys(r for key, v in held for r in code_in(key, v)))
        notes.insert(0, f"a run would import and run {refs}: left commented out, review it first")
        return Row(path, value, "code reference", targets, "; ".join(notes), held)
    status: Status = "approximated" if any(s.status == "approximated" for s in made) else "mapped"
    return Row(path, value, status, targets, "; ".join(notes))


def table(rows: list[Row]) -> str:
    """The rows as a Markdown table, code references, approximated and refused first: what
    needs a look."""
    order = {"code reference": 0, "approximated": 1, "refused": 2, "mapped": 3, "unset": 4}
    lines = ["| field | value | status | streamrl | notes |", "|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: order[r.status]):
        value = str(r.value).replace("|", "\\|")
        lines.append(f"| `{r.field}` | `{value}` | {r.status} | {r.target} | {r.note} |")
    counts = {s: sum(r.status == s for r in rows) for s in order}
    lines.append("")
    lines.append(", ".join(f"{n} {s}" for s, n in counts.items()))
    return "\n".join(lines)


def yaml_text(
    settings: dict[str, Any], rows: list[Row], base: str | None, source: str, dialect: Dialect
) -> str:
    """The converted settings over ``base``'s file (all of it, when given) as YAML, then the
    code references as commented-out overrides."""
    head = f"# converted from {dialect} config {source} by `streamrl config convert`\n"
    if base is not None:
        head += f"# on top of {base}\n"
    tree = read_tree(base)[1] if base is not None else {}
    text = head + yaml.safe_dump(_nest(settings, tree), sort_keys=False)
    held = [(key, value, r.field) for r in rows for key, value in r.held]
    if not held:
        return text
    lines = [
        "",
        f"# NOT SET: code references from {source}. A run imports and runs each one when it",
        "# starts, so check it names the code you mean (the module, the file, what it does), then",
        "# set it in this file or pass the line as an override: streamrl run --config FILE 'KEY=VALUE'",
    ]
    for key, value, field in held:
        lines.append(f"#   {key}={_flow(value)}    (from {field})")
    return text + "\n".join(lines) + "\n"


def _flow(value: Any) -> str:
    """``value`` as one line of YAML, as an override's value is written."""
    text = yaml.safe_dump(value, default_flow_style=True, width=2**31).rstrip("\n")
    return text.removesuffix("\n...")
