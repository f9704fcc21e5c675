"""Translate a TRL ``GRPOConfig``, ``SFTConfig`` or ``DPOConfig`` or a verl config into a
streamrl ``run``, ``sft`` or ``dpo`` config, field by field.

Every field of the foreign file gets a row: *mapped* (same meaning), *approximated* (the
nearest streamrl setting, and how it differs), *refused* (why) or *unset* (null there, so
streamrl's default stands). A field's rule (``convert_rules.RULES``: a value that changes on the
way, or fields read together) decides first, else its entry in the catalogue of every field of
the pinned releases (``convert_fields``, which ``docs/migrating.md``'s tables are written
from); a field of another release maps by its name in ``foreign.FOREIGN`` or a streamrl key of
the same unique name, approximated. A field's settings are checked against the schema
together: one the schema rejects is refused with the loader's reason, so the written YAML
always loads.

A setting that names code a run would import (``convert_rules.CODE_KEYS``: a plug-in reward,
an environment, ``trust_remote_code``) and that the base does not run already
is a *code reference*: listed first in the table and written commented out, never live, so a
converted config runs nothing the foreign file named until the user has looked; converting
imports nothing either.
May import ``streamrl.configs`` only.
"""

from __future__ import annotations

import functools
import typing
from typing import Any, NamedTuple

import yaml
from pydantic import BaseModel

from streamrl.configs import foreign
from streamrl.configs.convert_fields import CATALOGUES, entry
from streamrl.configs.convert_rules import NO_COUNTERPART, RULES, code_in
from streamrl.configs.convert_types import Dialect, Refused, Setting, Status
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
    """streamrl's key for a foreign field the catalogue does not know (an older release's), or
    None: its name in ``foreign.FOREIGN``, else a streamrl key of the same unique name."""
    leaf = path.rsplit(".", 1)[-1]
    if leaf in foreign.FOREIGN:
        return foreign.FOREIGN[leaf][1]
    same = _schema_leaves().get(leaf, [])
    return same[0] if len(same) == 1 else None


def _flatten(tree: dict, dialect: Dialect, prefix: str = "") -> dict[str, Any]:
    """A verl file's nested mappings -> dotted keys (a file may also spell them dotted, as
    verl's CLI does), down to the catalogue's fields: a mapping-valued one
    (``data.apply_chat_template_kwargs``) is one value. TRL's fields are flat already."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        path = f"{prefix}{key}"
        known = path in CATALOGUES[dialect] or dialect != "verl"
        if isinstance(value, dict) and value and not known:
            out.update(_flatten(value, dialect, f"{path}."))
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


def _settings(dialect: Dialect, path: str, value: Any, tree: dict, base) -> list[Setting]:
    """What the field's rule, else its catalogue entry, makes of ``value``."""
    rule = RULES[dialect].get(path)
    if rule is not None:
        return rule(value, tree, base)
    known = entry(dialect, path)
    if known is None:
        leaf = path.rsplit(".", 1)[-1]
        if leaf in RULES[dialect]:
            return RULES[dialect][leaf](value, tree, base)
        key = target_of(dialect, path)
        if key is None:
            raise Refused(NO_COUNTERPART)
        return [Setting(key, value, "approximated", "not a field of the catalogued release")]
    if known.status == "refused":
        raise Refused(known.note)
    if known.target == "-":
        if value not in known.only:
            raise Refused(known.note)
        return [Setting(None, value, known.status, known.note)]
    return [Setting(known.target, value, known.status)]


def _schema_error(base: str | None, settings: dict[str, Any]) -> str | None:
    """The loader's reason for refusing ``settings`` together on top of ``base``, or None."""
    try:
        load_config(base, settings, env={})
    except ConfigError as exc:
        reasons = [line.strip() for line in str(exc).splitlines()[1:]]
        return "; ".join(reasons) or str(exc)
    return None


def convert(
    tree: dict, dialect: Dialect, base: str | None = None
) -> tuple[dict[str, Any], list[Row]]:
    """(streamrl's settings, dotted, checked against the schema on top of ``base``; the rows).
    A field's settings are checked together (a schedule with its horizon). Two fields that set
    one key to different values: the first one wins, the other is refused naming it. A code
    reference's settings are in its row (``Row.held``), not in the settings. ConfigError when
    the settings pass field by field but not together, or a field cannot be read at all
    (reward weights that do not match the functions)."""
    if dialect not in RULES:
        raise ConfigError(f"--from {dialect}: one of {', '.join(RULES)}")
    _check_class(tree, dialect)
    base_cfg = load_config(base, env={}) if base is not None else None
    # code the base runs already is no new reference (its reward functions, reweighted)
    known = (
        {r for f in base_cfg.reward.functions for r in code_in("reward.functions", f.fn)}
        if base_cfg is not None
        else set()
    )
    settings: dict[str, Any] = {}
    set_by: dict[str, str] = {}
    rows: list[Row] = []
    for path, value in _flatten(tree, dialect).items():
        if value is None:
            rows.append(Row(path, value, "unset", "", "null: streamrl's default stands"))
            continue
        try:
            made = _settings(dialect, path, value, tree, base_cfg)
        except Refused as why:
            rows.append(Row(path, value, "refused", "", str(why)))
            continue
        problems = _clashes(made, settings, set_by, base, known)
        if problems:
            rows.append(Row(path, value, "refused", "", "; ".join(problems)))
            continue
        for s in made:
            if s.key is not None:
                settings[s.key] = s.value
                set_by.setdefault(s.key, path)
        rows.append(_row(path, value, made, known))
    for row in rows:
        for key, _ in row.held:
            settings.pop(key, None)
    # each field passed on its own; one that only fails beside another (a cross-key rule) is named
    load_config(base, settings, env={})
    return settings, rows


def _check_class(tree: dict, dialect: Dialect) -> None:
    """A ConfigError naming the --from to use when a TRL file has a field only another of TRL's
    classes has (a DPOConfig's beta is not GRPO's KL coefficient)."""
    if dialect == "verl":
        return
    for name in tree:
        others = [d for d in ("trl", "trl-sft", "trl-dpo") if name in CATALOGUES[d]]
        if others and dialect not in others:
            raise ConfigError(
                f"{name} is not a field of --from {dialect}: --from {' or --from '.join(others)}"
            )


def _clashes(
    made: list[Setting], settings: dict, set_by: dict, base: str | None, known: set[str]
) -> list[str]:
    """Why a field's settings cannot stand: a key another field set otherwise, or the loader's
    reason for the field's settings together on ``base`` ([]: none)."""
    problems = [
        f"{s.key} already {settings[s.key]!r} from {set_by[s.key]}"
        for s in made
        if s.key is not None and s.key in settings and settings[s.key] != s.value
    ]
    mine = {s.key: s.value for s in made if s.key is not None}
    if problems or not mine:
        return problems
    # a code reference is checked on its own: it replaces what the base names (e.g. the
    # rewards its target_parts refer to) only once the user sets it
    held = any(_new_code(k, v, known) for k, v in mine.items())
    reason = _schema_error(None if held else base, mine)
    return [reason] if reason is not None else []


def _new_code(key: str, value: Any, known: set[str]) -> list[str]:
    """The code a setting would run that the base does not run already."""
    return [r for r in code_in(key, value) if r not in known]


def _row(path: str, value: Any, made: list[Setting], known: set[str]) -> Row:
    targets = ", ".join(f"{s.key}={s.value!r}" for s in made if s.key) or "-"
    notes = [s.note for s in made if s.note]
    held = tuple((s.key, s.value) for s in made if s.key and _new_code(s.key, s.value, known))
    if held:
        refs = ", ".join(dict.fromkeys(r for key, v in held for r in _new_code(key, v, known)))
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
