"""What a member of the dist transport believes from the learner's store: only what the learner signed.

The store (a torch ``TCPStore``) answers whoever reaches its port, without credentials. So every
value the learner puts there that a member acts on (an epoch's final member list, each version's
header: version, layout, aliases, bucket size, publisher, checksums) is signed with HMAC-SHA256
under a random secret of that epoch, which the learner creates in Redis (``SET NX``: whoever
gets there first, everyone uses the value Redis holds) before it announces the epoch, and which
only the run's password holders can read. A member checks the signature before it does anything
with a value, and checks every field's type and range even when signed.

A signed value is ``v1:<hex HMAC>:<JSON body>``; the MAC covers the store key it was written
under too, so a signed value copied to another key (an old header replayed as the next one) is
refused. What an outsider on the store's port can still do is deny service (delete or overwrite
keys, break the group's rendezvous): that costs a publish at most ``weightsync.timeout_s``,
never a version, layout or checksum the learner did not send.

A refused value is counted (``streamrl_weights_refused_total{kind}``) and logged once per kind
per process: ``unsigned`` (not in the signed form), ``forged`` (a MAC that does not verify),
``malformed`` (signed, but a field out of type or range), ``no_secret`` (an epoch without its
secret in Redis), ``group`` (a group record in Redis that does not parse), ``heartbeat`` (a
member heartbeat that does not parse, or is not finite).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import math
import secrets
from dataclasses import dataclass

import redis
import torch

from streamrl.broker.client import as_str
from streamrl.broker.keys import Keys
from streamrl.weightsync import metrics
from streamrl.weightsync.layout import Layout

log = logging.getLogger(__name__)

_FORM = "v1"
_MAC_HEX = 2 * hashlib.sha256().digest_size
SECRET_BYTES = 32
# far above any real run, far below what overflows a C++ int64 or a Python loop
MAX_VERSION = 2**53
MAX_TENSORS = 1 << 20
MAX_MODEL_BYTES = 1 << 42
MAX_BUCKET_BYTES = 1 << 40
MAX_MEMBERS = 1 << 16
MAX_ID_CHARS = 256

_logged: set[str] = set()


class Refused(ValueError):
    """A value from the store (or a record in Redis) a member must not act on."""

    def __init__(self, kind: str, detail: str):
        super().__init__(f"{kind}: {detail}")
        self.kind = kind


def count_refused(kind: str, detail: str) -> None:
    """Count a refusal; the first of each kind in this process is logged."""
    metrics.REFUSED.labels(kind=kind).inc()
    if kind not in _logged:
        _logged.add(kind)
        log.warning(
            "weightsync dist: refused %s (%s); further ones are only counted in "
            "streamrl_weights_refused_total{kind=%r}",
            kind,
            detail[:300],
            kind,
        )


def create_secret(client: redis.Redis, keys: Keys, epoch: int) -> bytes:
    """The learner's: the secret of ``epoch``, made now unless Redis already holds one."""
    client.set(keys.weights_dist_secret(epoch), secrets.token_hex(SECRET_BYTES), nx=True)
    secret = epoch_secret(client, keys, epoch)
    if secret is None:
        raise redis.RedisError(f"{keys.weights_dist_secret(epoch)} vanished as it was made")
    return secret


def epoch_secret(client: redis.Redis, keys: Keys, epoch: int) -> bytes | None:
    """The secret of ``epoch`` as Redis holds it; None if it has none (or not one of ours)."""
    raw = client.get(keys.weights_dist_secret(epoch))
    try:
        secret = bytes.fromhex(as_str(raw)) if raw is not None else b""
    except ValueError:
        return None
    return secret if len(secret) == SECRET_BYTES else None


def _mac(secret: bytes, key: str, body: bytes) -> str:
    return hmac.new(secret, key.encode() + b"\0" + body, hashlib.sha256).hexdigest()


def sign(secret: bytes, key: str, value: object) -> bytes:
    """``value`` as JSON, signed for the store key ``key``."""
    body = json.dumps(value, separators=(",", ":")).encode()
    return f"{_FORM}:{_mac(secret, key, body)}:".encode() + body


def verify(secret: bytes, key: str, raw: bytes) -> object:
    """The JSON value signed for ``key``; ``Refused`` unless the learner signed exactly these bytes."""
    form, mac, body = raw[:3], raw[3 : 3 + _MAC_HEX], raw[4 + _MAC_HEX :]
    if form != f"{_FORM}:".encode() or raw[3 + _MAC_HEX : 4 + _MAC_HEX] != b":":
        raise Refused("unsigned", f"{key} holds {len(raw)} bytes not in the signed form")
    if not hmac.compare_digest(mac, _mac(secret, key, body).encode()):
        raise Refused("forged", f"{key}: the signature does not verify")
    try:
        return json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise Refused("malformed", f"{key}: {exc}") from exc


@dataclass(frozen=True)
class Header:
    """One version's header, every field checked."""

    version: int
    layout: Layout
    aliases: dict[str, str]
    bucket_bytes: int
    publisher: str
    # the learner's shm checksums, layout order (None: not sent)
    checksums: list[int] | None


def _int(value: object, low: int, high: int, what: str) -> int:
    # bool is an int to Python, and JSON floats are not counts
    if type(value) is not int or not low <= value <= high:
        raise Refused("malformed", f"{what} {value!r} is not an int in [{low}, {high}]")
    return value


def _text(value: object, what: str) -> str:
    if not isinstance(value, str) or len(value) > MAX_ID_CHARS:
        raise Refused("malformed", f"{what} is not a string of <= {MAX_ID_CHARS} characters")
    return value


def _layout(data: object) -> Layout:
    if not isinstance(data, list) or not 0 < len(data) <= MAX_TENSORS:
        raise Refused("malformed", "the layout is not a list of 1..2**20 tensors")
    for entry in data:
        if not (isinstance(entry, list) and len(entry) == 3 and isinstance(entry[1], list)):
            raise Refused("malformed", f"layout entry {str(entry)[:80]} is not [name, shape, dtype]")
        _text(entry[0], "a tensor name")
        for dim in entry[1]:
            _int(dim, 0, MAX_MODEL_BYTES, "a tensor dimension")
        if not isinstance(getattr(torch, _text(entry[2], "a dtype"), None), torch.dtype):
            raise Refused("malformed", f"tensor {entry[0]!r}: {entry[2]!r} is not a torch dtype")
    try:
        layout = Layout.from_json(data)
        total = layout.total_bytes
    except (ValueError, OverflowError) as exc:
        raise Refused("malformed", f"layout: {exc}") from exc
    if len({spec.name for spec in layout.specs}) != len(layout.specs) or total > MAX_MODEL_BYTES:
        raise Refused("malformed", "the layout repeats a tensor name or exceeds 4 TiB")
    return layout


def header(value: object) -> Header:
    """The checked fields of a signed version header."""
    if not isinstance(value, dict):
        raise Refused("malformed", "a header is not a JSON object")
    layout = _layout(value.get("layout"))
    names = {spec.name for spec in layout.specs}
    aliases = value.get("aliases")
    if not isinstance(aliases, dict) or not all(
        isinstance(k, str) and v in names for k, v in aliases.items()
    ):
        raise Refused("malformed", "aliases must map names to tensors of the layout")
    sums = value.get("checksums")
    if sums is not None:
        if not isinstance(sums, list) or len(sums) != len(layout.specs):
            raise Refused("malformed", "checksums must be one per tensor of the layout")
        sums = [_int(s, 0, 2**64 - 1, "a checksum") for s in sums]
    return Header(
        version=_int(value.get("version"), 0, MAX_VERSION, "version"),
        layout=layout,
        aliases=aliases,
        bucket_bytes=_int(value.get("bucket_bytes"), 1, MAX_BUCKET_BYTES, "bucket_bytes"),
        publisher=_text(value.get("publisher", ""), "publisher"),
        checksums=sums,
    )


def members(value: object) -> list[str]:
    """The checked member list of a signed ``final``."""
    if not isinstance(value, list) or len(value) > MAX_MEMBERS:
        raise Refused("malformed", "the final member list is not a list")
    listed = [_text(m, "a member id") for m in value]
    if len(set(listed)) != len(listed):
        raise Refused("malformed", "the final member list repeats a member")
    return listed


@dataclass(frozen=True)
class GroupRecord:
    """``{weights}:dist:group`` (written by the learner in Redis), every field checked."""

    epoch: int
    host: str
    port: int
    backend: str
    members: list[str]
    host_id: str


def group_record(raw: bytes | str) -> GroupRecord:
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise Refused("group", f"the group record does not parse: {exc}") from exc
    if not isinstance(value, dict) or value.get("backend") not in ("gloo", "nccl"):
        raise Refused("group", "the group record is not an object with a gloo/nccl backend")
    try:
        return GroupRecord(
            epoch=_int(value.get("epoch"), 0, MAX_VERSION, "epoch"),
            host=_text(value.get("host"), "host"),
            port=_int(value.get("port"), 1, 65535, "port"),
            backend=value["backend"],
            members=members(value.get("members")),
            host_id=_text(value.get("host_id", ""), "host_id"),
        )
    except Refused as exc:
        raise Refused("group", str(exc)) from exc


def beat(value: bytes | str) -> tuple[float, int, int] | None:
    """(expiry, seen epoch, joined epoch) of a member's heartbeat ``"<expiry> <seen> <joined>"``
    (seen: the newest group record it acted on; joined: the epoch whose group it is in, -1 for
    none; missing fields read as -1); None when it does not parse or its expiry is not finite (a ``nan`` compares false with any time: it would never
    expire), which the publisher drops as it drops an expired one."""
    try:
        expiry, seen, joined = (as_str(value).split(" ", 2) + ["-1", "-1"])[:3]
        when, epochs = float(expiry), (int(seen), int(joined))
    except (ValueError, TypeError):
        return None
    return (when, *epochs) if math.isfinite(when) else None
