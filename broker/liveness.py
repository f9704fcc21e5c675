"""Actor heartbeats: a hash per actor with a TTL of three beats, and a zset of known actors.

A killed actor's hash expires by itself; ``alive_actors`` lists actors whose hash still exists
and prunes the rest from the zset.
"""

from __future__ import annotations

import os
import socket
import time

import redis
import redis.asyncio

from streamrl.broker.keys import Keys


class Heartbeats:
    def __init__(
        self,
        redis_client: redis.asyncio.Redis,
        keys: Keys,
        heartbeat_s: float,
        host_id: str | None = None,
    ):
        self.redis = redis_client
        # the run's name for this host (run.host_id), which inspect and the live view group by
        self.host_id = host_id or socket.gethostname()
        self.keys = keys
        self.heartbeat_s = heartbeat_s
        self.ttl_ms = max(1, int(3 * heartbeat_s * 1000))

    async def beat(
        self, actor_id: str, version: int = 0, tokens_per_s: float = 0.0, **extra: str | int | float
    ) -> None:
        """Announce that ``actor_id`` lives; call every ``actor.heartbeat_s``."""
        fields = {
            "host": self.host_id,
            "pid": os.getpid(),
            "version": version,
            "tokens_per_s": tokens_per_s,
            "time": time.time(),
            **extra,
        }
        key = self.keys.actor(actor_id)
        pipe = self.redis.pipeline(transaction=True)
        pipe.hset(key, mapping=fields)
        pipe.pexpire(key, self.ttl_ms)
        pipe.zadd(self.keys.actors, {actor_id: time.time()})
        await pipe.execute()

    async def forget(self, actor_id: str) -> None:
        """Clean shutdown of an actor: remove it at once instead of waiting for the TTL."""
        pipe = self.redis.pipeline(transaction=True)
        pipe.delete(self.keys.actor(actor_id))
        pipe.zrem(self.keys.actors, actor_id)
        await pipe.execute()


def alive_actors(client: redis.Redis, keys: Keys) -> list[dict[str, str]]:
    """Sync: the live actors' last heartbeats, each with its ``id``, sorted by id."""
    ids = [i.decode() for i in client.zrange(keys.actors, 0, -1)]
    if not ids:
        return []
    pipe = client.pipeline(transaction=False)
    for actor_id in ids:
        pipe.hgetall(keys.actor(actor_id))
    out, dead = [], []
    for actor_id, fields in zip(ids, pipe.execute(), strict=True):
        if fields:
            out.append({"id": actor_id, **{k.decode(): v.decode() for k, v in fields.items()}})
        else:
            dead.append(actor_id)
    if dead:
        client.zrem(keys.actors, *dead)
    return sorted(out, key=lambda a: a["id"])
