"""The base of every config section: unknown keys are errors, one value where a list goes is a list
of one.

Unknown keys are errors (``extra="forbid"``) so a typo fails at start instead of silently doing
nothing. Imports nothing from streamrl: the backends' own option classes (``actors.engines``,
``weightsync.transports``) derive from ``Section`` too.
"""

from __future__ import annotations

import types
import typing

from pydantic import BaseModel, ConfigDict, model_validator


def _takes_list(annotation) -> bool:
    """Whether a field's type is a list (``list[X]`` or ``list[X] | None``)."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return any(_takes_list(a) for a in typing.get_args(annotation))
    return typing.get_origin(annotation) is list


def _literal_allows(annotation, value) -> bool:
    """Whether a ``Literal`` arm of the field's type takes ``value`` as it is (``actor.gpus``'s
    ``"share"`` stays a string)."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return any(_literal_allows(a, value) for a in typing.get_args(annotation))
    return typing.get_origin(annotation) is typing.Literal and value in typing.get_args(annotation)


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    @model_validator(mode="before")
    @classmethod
    def _scalar_to_list(cls, data):
        """One value where a list is expected is a list of one, as TRL reads
        ``--report_to wandb``: ``run.report_to=wandb`` is ``[wandb]``."""
        if not isinstance(data, dict):
            return data
        return {
            key: [value]
            if key in cls.model_fields
            and isinstance(value, (str, int, float, dict))
            and _takes_list(cls.model_fields[key].annotation)
            and not _literal_allows(cls.model_fields[key].annotation, value)
            else value
            for key, value in data.items()
        }


def check_indices(key: str, indices: list[int], what: str = "GPU") -> None:
    if not indices:
        raise ValueError(f"{key}=[]: list at least one {what} (or leave it unset)")
    if any(i < 0 for i in indices):
        raise ValueError(f"{key}={indices}: {what} indices must be >= 0")
    if len(set(indices)) != len(indices):
        raise ValueError(f"{key}={indices}: an index is listed twice")
