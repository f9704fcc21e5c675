"""The vocabulary of ``convert``: the dialects, a field's status, what a rule makes of a field
(``Setting``) or its refusal (``Refused``), and a catalogue entry (``Entry``) with the helpers
that write a group of fields refused for one reason."""

from __future__ import annotations

from typing import Any, Literal, NamedTuple

Dialect = Literal["trl", "trl-sft", "trl-dpo", "verl"]
Status = Literal["code reference", "mapped", "approximated", "refused", "unset"]
VERL_ACTOR = "actor_rollout_ref.actor."


def value_at(tree: dict, path: str) -> Any:
    """The value at dotted ``path`` of a nested tree, or None."""
    node: Any = tree
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


class Setting(NamedTuple):
    """What a rule makes of one foreign field: streamrl's key (None: nothing to set), the value."""

    key: str | None
    value: Any
    status: Status = "mapped"
    note: str = ""


class Refused(Exception):
    """A rule's reason for refusing a field."""


class Entry(NamedTuple):
    """A catalogue's word on one foreign field."""

    status: Status
    # one schema key when the field has no rule in convert_rules.RULES; else what the rule sets
    target: str
    note: str = ""
    # target "-" (nothing to set): the values that mean streamrl's behaviour; others are refused
    only: tuple = ()


def each(names: str, status: Status, target: str, note: str = "") -> dict[str, Entry]:
    """One entry for each whitespace-separated name: a group refused (or mapped) for one reason."""
    return {n: Entry(status, target, note) for n in names.split()}


def refused(names: str, why: str) -> dict[str, Entry]:
    return each(names, "refused", "", why)


def under(prefix: str, names: str, why: str) -> dict[str, Entry]:
    """The names, each under ``prefix``, refused for one reason."""
    return refused(" ".join(prefix + n for n in names.split()), why)
