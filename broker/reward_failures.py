"""How a group tells the learner which reward functions failed on it: scalar keys in its meta.

The actor scores, the learner reports and decides; this is the contract between them, in
the group's ``meta`` map (scalars only, so the wire format is unchanged): per function that
failed on some of the group's samples, ``reward_failed/<name>`` = how many, and
``reward_error/<name>`` = its first exception, cut to ``ERROR_CHARS``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

FAILED = "reward_failed/"
ERROR = "reward_error/"
ERROR_CHARS = 500


def encode(failures: Sequence[Mapping[str, str]]) -> dict[str, int | str]:
    """Meta entries for a group whose sample ``i`` failed the functions ``failures[i]``
    (function name -> its exception text)."""
    meta: dict[str, int | str] = {}
    for sample in failures:
        for name, error in sample.items():
            meta[FAILED + name] = int(meta.get(FAILED + name, 0)) + 1
            meta.setdefault(ERROR + name, str(error)[:ERROR_CHARS])
    return meta


def decode(meta: Mapping[str, object]) -> tuple[dict[str, int], dict[str, str]]:
    """(failed samples per function, first exception per function) of one group's meta; keys
    of another shape are ignored, so a hostile count cannot raise (it is clamped to >= 0)."""
    counts: dict[str, int] = {}
    errors: dict[str, str] = {}
    for key, value in meta.items():
        if key.startswith(FAILED) and isinstance(value, (int, float)) and value == value:
            counts[key.removeprefix(FAILED)] = max(0, int(value))
        elif key.startswith(ERROR) and isinstance(value, str):
            errors[key.removeprefix(ERROR)] = value[:ERROR_CHARS]
    return counts, errors
