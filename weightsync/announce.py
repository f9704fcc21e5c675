"""Version announcements through Redis: the ``weights`` hash holds the newest version and its transport
metadata (so late actors find it), and a message on ``weights:notify`` wakes subscribers up.

Pub/sub only wakes; the hash is the truth, re-read on every wake-up and on a
short poll, so a lost message or a reconnect costs latency, never a version.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

import redis

from streamrl.broker.client import as_str
from streamrl.broker.keys import Keys


@dataclass(frozen=True)
class Announcement:
    version: int
    transport: str
    # id of the publisher instance; a restarted learner may restart version numbers
    publisher: str
    meta: dict
    published_at: float


def announce(
    client: redis.Redis, keys: Keys, version: int, transport: str, publisher: str, meta: dict
) -> None:
    fields = {
        "version": version,
        "transport": transport,
        "publisher": publisher,
        "meta": json.dumps(meta, separators=(",", ":")),
        "published_at": time.time(),
    }
    pipe = client.pipeline(transaction=True)
    pipe.hset(keys.weights, mapping=fields)
    pipe.publish(keys.weights_notify, str(version))
    pipe.execute()


def read_announcement(client: redis.Redis, keys: Keys) -> Announcement | None:
    """The newest announcement, or None if nothing was published yet. Malformed hashes raise ValueError."""
    raw = client.hgetall(keys.weights)
    if not raw:
        return None
    fields = {as_str(k): as_str(v) for k, v in raw.items()}
    try:
        return Announcement(
            version=int(fields["version"]),
            transport=fields["transport"],
            publisher=fields["publisher"],
            meta=json.loads(fields["meta"]),
            published_at=float(fields["published_at"]),
        )
    except (KeyError, ValueError, TypeError) as exc:
        raise ValueError(f"malformed weights announcement in {keys.weights}: {exc!r}") from exc


class Watcher:
    """Blocks up to a timeout for the next notify message; the caller then re-reads the hash."""

    def __init__(self, client: redis.Redis, keys: Keys):
        self._pubsub = client.pubsub(ignore_subscribe_messages=True)
        self._pubsub.subscribe(keys.weights_notify)

    def wait(self, timeout_s: float) -> bool:
        """True if a notification arrived within ``timeout_s``."""
        try:
            return self._pubsub.get_message(timeout=timeout_s) is not None
        except (redis.ConnectionError, redis.TimeoutError):
            # Redis away: back off; the next hash read says what we missed
            time.sleep(min(timeout_s, 0.5))
            return False

    def close(self) -> None:
        self._pubsub.close()
