"""Translate a TRL ``GRPOConfig`` or a verl config into a streamrl config, field by field.

Every field of the foreign file gets a row: *mapped* (same meaning), *approximated* (the
nearest streamrl setting, and how it differs), *refused* (no counterpart, and why) or *unset*
(null there, so streamrl's default stands). Names resolve through ``foreign.FOREIGN`` (the
map the loader's unknown-key hint uses), then the verl paths whose last part alone is
ambiguous (``actor_rollout_ref.rollout.n``), then a streamrl key of the same unique name
(``temperature``, ``seed``). Each value is checked against the schema on its own: one the
schema rejects is refused with the loader's reason, so the written YAML always loads.
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
)
from streamrl.configs.errors import ConfigError
from streamrl.configs.load import _read, load_config
from streamrl.configs.schema import Config


class Row(NamedTuple):
    field: str
    value: Any
    status: Status
    target: str
    note: str


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


def _nest(flat: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
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
    refused naming it. ConfigError when the settings pass one by one but not together."""
    if dialect not in RULES:
        raise ConfigError(f"--from {dialect}: trl or verl")
    flat = _flatten(tree)
    settings: dict[str, Any] = {}
    set_by: dict[str, str] = {}
    rows: list[Row] = []
    for path, value in flat.items():
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
            elif (error := _schema_error(base, s.key, s.value)) is not None:
                problems.append(error)
        if problems:
            rows.append(Row(path, value, "refused", "", "; ".join(problems)))
            continue
        for s in made:
            if s.key is not None:
                settings[s.key] = s.value
                set_by.setdefault(s.key, path)
        status: Status = (
            "approximated" if any(s.status == "approximated" for s in made) else "mapped"
        )
        targets = ", ".join(f"{s.key}={s.value!r}" for s in made if s.key) or "-"
        notes = "; ".join(s.note for s in made if s.note)
        rows.append(Row(path, value, status, targets, notes))
    # each value passed on its own; one that only fails beside another (a cross-key rule) is named
    load_config(base, settings, env={})
    return settings, rows


def table(rows: list[Row]) -> str:
    """The rows as a Markdown table, approximated and refused first: what needs a look."""
    order = {"approximated": 0, "refused": 1, "mapped": 2, "unset": 3}
    lines = ["| field | value | status | streamrl | notes |", "|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: order[r.status]):
        value = str(r.value).replace("|", "\\|")
        lines.append(f"| `{r.field}` | `{value}` | {r.status} | {r.target} | {r.note} |")
    counts = {s: sum(r.status == s for r in rows) for s in order}
    lines.append("")
    lines.append(", ".join(f"{n} {s}" for s, n in counts.items()))
    return "\n".join(lines)


def yaml_text(settings: dict[str, Any], base: str | None, source: str, dialect: Dialect) -> str:
    """The converted settings over ``base``'s file (all of it, when given) as YAML."""
    head = f"# converted from {dialect} config {source} by `streamrl config convert`\n"
    if base is None:
        return head + yaml.safe_dump(_nest(settings), sort_keys=False)
    tree = yaml.safe_load(_read(base)[1]) or {}
    for path, value in settings.items():
        node = tree
        *parents, leaf = path.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return head + f"# on top of {base}\n" + yaml.safe_dump(tree, sort_keys=False)
