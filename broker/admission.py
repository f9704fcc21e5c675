"""Admission control for bounded staleness: counters in Redis that actors and learner share.

An actor may start a group iff

    accepted + live_leases < consumed + (max_staleness // versions_per_batch + 1) * groups_per_step

(AReaL's ``(S + v + 1)·B − (accepted + running) > 0`` with ``v·B`` replaced by
the count of entries the learner took off the stream, so skipped groups can
never starve it). In-flight groups are leases in a zset scored by their expiry,
so a SIGKILLed actor's slots free themselves after ``broker.lease_ttl_s``.
The check and the lease are one Lua script (atomic); the clock is Redis's, so
actors on hosts with skewed clocks agree.
"""

from __future__ import annotations

import asyncio
import time
import uuid

import redis.asyncio

from broker.keys import Keys
from configs.schema import Config

# KEYS: accepted, consumed, leases. ARGV: lease id, ttl ms, capacity. Returns 1 if leased.
_TRY_START = """
redis.replicate_commands()
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
local accepted = tonumber(redis.call('GET', KEYS[1]) or '0')
local consumed = tonumber(redis.call('GET', KEYS[2]) or '0')
local live = redis.call('ZCARD', KEYS[3])
if accepted + live < consumed + tonumber(ARGV[3]) then
  redis.call('ZADD', KEYS[3], now + tonumber(ARGV[2]), ARGV[1])
  return 1
end
return 0
"""

# KEYS: leases. ARGV: lease id, ttl ms. Returns 1 if the lease was still live.
_RENEW = """
redis.replicate_commands()
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return redis.call('ZADD', KEYS[1], 'XX', 'CH', now + tonumber(ARGV[2]), ARGV[1])
"""


class Admission:
    """Actor side: ``try_start``/``renew``/``release``. Learner side: ``set_version``/``add_consumed``."""

    def __init__(self, redis_client: redis.asyncio.Redis, cfg: Config):
        self.redis = redis_client
        self.keys = Keys.from_config(cfg)
        # a batch advances the version by updates_per_batch x minibatches, so max_staleness versions
        # are max_staleness // versions_per_batch batches of look-ahead (AReaL's rule counts batches)
        lookahead = cfg.algo.max_staleness // cfg.learner.versions_per_batch
        self.capacity = (lookahead + 1) * cfg.learner.groups_per_step
        self.ttl_ms = int(cfg.broker.lease_ttl_s * 1000)
        self._try_start = redis_client.register_script(_TRY_START)
        self._renew = redis_client.register_script(_RENEW)

    async def try_start(self, actor_id: str) -> str | None:
        """A lease id if the actor may start one more group now, else None."""
        lease_id = f"{actor_id}:{uuid.uuid4().hex}"
        k = self.keys
        ok = await self._try_start(
            keys=[k.accepted, k.consumed, k.leases], args=[lease_id, self.ttl_ms, self.capacity]
        )
        return lease_id if ok else None

    async def start(self, actor_id: str, timeout_s: float, poll_s: float = 0.05) -> str | None:
        """``try_start`` until it succeeds or ``timeout_s`` passes (then None)."""
        deadline = time.monotonic() + timeout_s
        while True:
            lease = await self.try_start(actor_id)
            if lease is not None or time.monotonic() >= deadline:
                return lease
            await asyncio.sleep(min(poll_s, max(0.0, deadline - time.monotonic())))

    async def renew(self, lease_id: str) -> bool:
        """Push a long-running group's lease expiry out by another TTL; False if it already expired."""
        return bool(await self._renew(keys=[self.keys.leases], args=[lease_id, self.ttl_ms]))

    async def release(self, lease_id: str, accepted: bool = False) -> None:
        """Drop a lease. ``RolloutProducer.publish(group, lease_id)`` already does this and counts
        the group; pass ``accepted=True`` only for a group put into the stream some other way."""
        pipe = self.redis.pipeline(transaction=True)
        pipe.zrem(self.keys.leases, lease_id)
        if accepted:
            pipe.incr(self.keys.accepted)
        await pipe.execute()

    async def version(self) -> int:
        return int(await self.redis.get(self.keys.version) or 0)

    async def set_version(self, version: int) -> None:
        await self.redis.set(self.keys.version, int(version))

    async def add_consumed(self, n: int) -> None:
        """Count entries taken off the stream outside ``RolloutConsumer.read`` (it counts its own)."""
        if n:
            await self.redis.incrby(self.keys.consumed, n)

    async def counts(self) -> dict[str, int]:
        """accepted, consumed, live leases (expired ones included until the next try_start) and capacity."""
        pipe = self.redis.pipeline(transaction=True)
        pipe.get(self.keys.accepted)
        pipe.get(self.keys.consumed)
        pipe.zcard(self.keys.leases)
        accepted, consumed, leases = await pipe.execute()
        return {
            "accepted": int(accepted or 0),
            "consumed": int(consumed or 0),
            "leases": leases,
            "capacity": self.capacity,
        }
