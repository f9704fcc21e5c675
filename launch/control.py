"""The scale command on the wire: which Redis list a supervisor reads, who may write to it, and
what an entry must be before a supervisor acts on it.

Every host of a run holds the Redis password, so a list alone would let any of them (or anyone
who took one over) scale every other. A supervisor therefore draws a key when it starts and keeps
it beside its state, readable by its user only (``<state dir>/scale.key``: ``run.dir`` for
``streamrl run``, ``<run.dir>/hosts/<host_id>`` for ``streamrl actors``). An entry is applied only
when it is signed with that key (HMAC-SHA256 over the list's name, the count and a time stamp),
so it was written for this list by someone who can read this host's key; newer than the last one
applied, so a replayed entry does nothing; and a plain JSON object of a few hundred bytes whose
count is an ``int`` from 0 to ``actor.max_actors`` (larger is clamped). Anything else is dropped
with a line in the supervisor's log: one peer's malformed entry never stops a supervisor.

A host is scaled only from itself, then, unless the operator shares ``run.dir`` or copies the key
(``streamrl scale --key-file``).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

from streamrl.configs.runfiles import write_new

KEY_FILE = "scale.key"
# an entry is a handful of fields: anything longer is not one (and a deep array or a
# 5000-digit number never reaches the JSON parser)
MAX_ENTRY_BYTES = 512


class BadCommand(ValueError):
    """An entry on a scale list that is dropped; the message says why."""


@dataclass(frozen=True)
class ScaleCommand:
    actors: int
    # time.time_ns() when it was signed: a supervisor applies only newer ones
    at: int


def control_key(launch_control: str, host_id: str) -> str:
    """The Redis list the supervisor of ``host_id``'s actors takes scale commands from."""
    return f"{launch_control}:{host_id}"


def create_key(state_dir: str | Path) -> bytes:
    """A fresh key for the supervisor that keeps its state in ``state_dir`` (mode 0600)."""
    key = secrets.token_hex(32)
    write_new(Path(state_dir) / KEY_FILE, key + "\n")
    return key.encode()


def _mac(key: bytes, list_key: str, actors: int, at: int) -> str:
    return hmac.new(key, f"{list_key}|{actors}|{at}".encode(), hashlib.sha256).hexdigest()


def encode(key: bytes, list_key: str, actors: int, at: int | None = None) -> str:
    """The entry asking the supervisor reading ``list_key`` for ``actors`` actors."""
    at = time.time_ns() if at is None else at
    return json.dumps({"actors": actors, "at": at, "mac": _mac(key, list_key, actors, at)})


def _refuse_constant(name: str) -> None:
    raise BadCommand(f"{name} is not a count")


def decode(raw: bytes | str, key: bytes, list_key: str, max_actors: int) -> ScaleCommand:
    """The command in ``raw``, or BadCommand saying why it is dropped. A count past
    ``max_actors`` is returned as it is: the supervisor clamps it and says so."""
    if len(raw) > MAX_ENTRY_BYTES:
        raise BadCommand(f"{len(raw)} bytes, over {MAX_ENTRY_BYTES}")
    try:
        entry = json.loads(raw, parse_constant=_refuse_constant)
    except (ValueError, RecursionError) as exc:
        raise BadCommand(f"not JSON: {exc}") from None
    if not isinstance(entry, dict) or set(entry) != {"actors", "at", "mac"}:
        raise BadCommand('not {"actors": N, "at": T, "mac": M}')
    actors, at, mac = entry["actors"], entry["at"], entry["mac"]
    # bool is an int to Python, a float (1e999 is inf) is not a count
    if type(actors) is not int or type(at) is not int or not isinstance(mac, str):
        raise BadCommand("actors and at must be integers, mac a string")
    if not hmac.compare_digest(mac, _mac(key, list_key, actors, at)):
        raise BadCommand("not signed with this supervisor's key (scale.key)")
    if actors < 0:
        raise BadCommand(f"actors={actors} is negative")
    return ScaleCommand(actors, at)


def preview(raw: bytes | str, limit: int = 80) -> str:
    """What a log line shows of a dropped entry: its start, never all of a flood."""
    text = repr(raw[:limit])
    return text if len(raw) <= limit else f"{text}... ({len(raw)} bytes)"
