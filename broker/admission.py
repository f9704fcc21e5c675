"""Admission control for bounded staleness: counters in Redis that actors and learner share.

An actor whose engine runs version ``v`` may start a group iff

    accepted + live_leases < consumed + discarded + trimmed + slots(min(v, lease versions))
    slots(u) = (floor((u + max_staleness - version) / versions_per_batch) + 1) * groups_per_step
               (0 when u + max_staleness < version)

- ``consumed``: groups taken by the learner's *completed* steps (trained or dropped),
  written as a running total from the learner's checkpointed progress with
  ``SET`` if larger, so a retried or replayed write never counts twice and a
  killed learner leaks nothing (it re-reads and re-counts its pending entries);
- ``discarded``: entries acked without training (dead-lettered, duplicates),
  counted in the same script as their XACK, once;
- ``trimmed``: entries a MAXLEN trim removed before anyone read them;
- ``version``: the learner's newest published version;
- ``max_staleness``: read only under ``algo.max_staleness: auto``, where the learner sets it after
  every step (``learner.staleness_control``) and every ``try_start`` reads it, so actors follow a
  new bound at once. The script clamps it to the actor's own configured ``[min, max]`` and takes
  ``min`` while none (or no number) is set: whoever writes the key can move the bound only within
  what the actors' config allows. With a fixed bound the key is never read.

Why it bounds staleness: the stream is FIFO and every step takes at least
``groups_per_step`` entries, so the next ``slots(u)`` positions after
``consumed + discarded + trimmed`` are taken by steps that start at versions
``<= u + max_staleness``. ``version`` is never below the version the next step
starts at, so it errs on the safe side. A group leased now may overtake groups
still being generated, so the bound uses the oldest version among the live
leases of live actor processes (heartbeat with their pid) as well: a lagging actor (and anyone racing
it) gets a tighter bound.
This is AReaL's ``(S + v + 1)·B − (accepted + running) > 0`` with ``v`` the
generating engine's version and ``v·B`` replaced by what the learner actually
took, so a learner that drops groups or samples dynamically never starves.

In-flight groups are leases in a zset scored by their expiry (member
``{actor}:{pid}:{uuid}@{version}``), so a SIGKILLed actor's slots free themselves
after ``broker.lease_ttl_s``. The check and the lease are one Lua script
(atomic); the clock is Redis's, so actors on hosts with skewed clocks agree.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass, replace

import redis.asyncio

from streamrl.broker.keys import Keys
from streamrl.broker.semantics import is_stale
from streamrl.configs.schema import AlgoConfig, LearnerConfig

# KEYS: accepted, consumed, discarded, trimmed, leases, version, published bound. ARGV: lease id,
# ttl ms, actor version, max_staleness (auto: the lowest), versions_per_batch, groups_per_step,
# heartbeat key prefix, the highest bound ('' = fixed: the published bound is not read).
# Returns {granted (0/1), accepted + live after the call, the bound}.
# Only leases of a live process (its actor's heartbeat names its pid) hold the bound down: a killed
# actor's lease keeps its slot until it expires, but must not cap everybody else at its old version
# meanwhile, not even once the actor is restarted under the same id.
_TRY_START = """
redis.replicate_commands()
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[5], '-inf', now)
local oldest = tonumber(ARGV[3])
local live = redis.call('ZRANGE', KEYS[5], 0, -1)
for _, member in ipairs(live) do
  local actor, pid, v = string.match(member, '^(.*):(%d+):%x+@(%d+)$')
  if v and tonumber(v) < oldest and redis.call('HGET', ARGV[7] .. actor, 'pid') == pid then
    oldest = tonumber(v)
  end
end
local function num(key) return tonumber(redis.call('GET', key) or '0') end
local ahead = num(KEYS[1]) + #live
local taken = num(KEYS[2]) + num(KEYS[3]) + num(KEYS[4])
local staleness = tonumber(ARGV[4])
if ARGV[8] ~= '' then
  -- comparisons, not math.min/max: a NaN written there fails them all and leaves the lowest
  local published = tonumber(redis.call('GET', KEYS[7]) or '')
  if published and published > tonumber(ARGV[8]) then
    staleness = tonumber(ARGV[8])
  elseif published and published >= staleness then
    staleness = math.floor(published)
  end
end
local room = oldest + staleness - num(KEYS[6])
local slots = 0
if room >= 0 then slots = (math.floor(room / tonumber(ARGV[5])) + 1) * tonumber(ARGV[6]) end
if ahead < taken + slots then
  redis.call('ZADD', KEYS[5], now + tonumber(ARGV[2]), ARGV[1])
  return {1, ahead + 1, taken + slots}
end
return {0, ahead, taken + slots}
"""

# KEYS: leases. ARGV: lease id, ttl ms. Returns 1 if the lease was still live.
_RENEW = """
redis.replicate_commands()
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return redis.call('ZADD', KEYS[1], 'XX', 'CH', now + tonumber(ARGV[2]), ARGV[1])
"""

# KEYS: consumed, version. ARGV: running total, version ('' = leave it). Idempotent: a retry, a
# replayed step or a stale writer can never lower the count or add to it twice. One script, so
# no actor sees the count of a finished step together with the version before it (too loose).
_SET_CONSUMED = """
if ARGV[2] ~= '' then redis.call('SET', KEYS[2], ARGV[2]) end
local current = tonumber(redis.call('GET', KEYS[1]) or '0')
if tonumber(ARGV[1]) > current then redis.call('SET', KEYS[1], ARGV[1]) return ARGV[1] end
return current
"""


@dataclass(frozen=True)
class Bounds:
    """What the bound reads: the staleness limit and what one learner step takes and publishes."""

    # the fixed bound; under auto the lowest, in force until the learner publishes one
    max_staleness: int
    versions_per_batch: int
    groups_per_step: int
    # auto: the highest bound a published one is clamped to (None: fixed, none is read)
    highest: int | None = None

    @classmethod
    def from_config(cls, algo: AlgoConfig, learner: LearnerConfig) -> Bounds:
        lowest, highest = algo.staleness_range
        return cls(
            max_staleness=lowest,
            versions_per_batch=learner.versions_per_batch,
            groups_per_step=learner.groups_per_step,
            highest=highest if algo.max_staleness == "auto" else None,
        )

    @property
    def ceiling(self) -> int:
        """The most staleness admission may ever allow."""
        return self.max_staleness if self.highest is None else self.highest


def slots(version: int, learner_version: int, bounds: Bounds) -> int:
    """Groups beyond the consumed count an engine at ``version`` may start (see the module doc)."""
    if is_stale(learner_version, version, bounds.max_staleness):
        return 0
    room = version + bounds.max_staleness - learner_version
    return (room // bounds.versions_per_batch + 1) * bounds.groups_per_step


def lease_version(lease_id: str) -> int:
    return int(lease_id.rsplit("@", 1)[1])


class Admission:
    """Actor side: ``try_start``/``renew``/``release``. Learner side: ``set_version``/``set_consumed``."""

    def __init__(
        self, redis_client: redis.asyncio.Redis, keys: Keys, bounds: Bounds, lease_ttl_s: float
    ):
        self.redis = redis_client
        self.keys = keys
        self.bounds = bounds
        # the bound for an actor on the learner's own version (what a live view shows as
        # capacity), at the highest bound admission may be set to
        self.capacity = slots(0, 0, replace(bounds, max_staleness=bounds.ceiling))
        self.ttl_ms = int(lease_ttl_s * 1000)
        self._try_start = redis_client.register_script(_TRY_START)
        self._renew = redis_client.register_script(_RENEW)
        self._set_consumed = redis_client.register_script(_SET_CONSUMED)

    async def try_start(self, actor_id: str, version: int) -> str | None:
        """A lease id if an actor whose engine runs ``version`` may start one more group now."""
        granted, _, _ = await self.check(actor_id, version)
        return granted

    async def check(self, actor_id: str, version: int) -> tuple[str | None, int, int]:
        """``try_start`` that also returns (accepted + live leases, bound) as the script saw them."""
        lease_id = f"{actor_id}:{os.getpid()}:{uuid.uuid4().hex}@{int(version)}"
        k, b = self.keys, self.bounds
        ok, ahead, bound = await self._try_start(
            keys=[k.accepted, k.consumed, k.discarded, k.trimmed, k.leases, k.version, k.bound],
            args=[
                lease_id,
                self.ttl_ms,
                int(version),
                b.max_staleness,
                b.versions_per_batch,
                b.groups_per_step,
                k.actor(""),
                "" if b.highest is None else b.highest,
            ],
        )
        return (lease_id if ok else None), int(ahead), int(bound)

    async def renew(self, lease_id: str) -> bool:
        """Push a long-running group's lease expiry out by another TTL; False if it already expired."""
        return bool(await self._renew(keys=[self.keys.leases], args=[lease_id, self.ttl_ms]))

    async def release(self, lease_id: str) -> None:
        """Drop the lease of a group given up; ``RolloutProducer.publish(group, lease_id)`` drops
        the lease of a published group itself, in the script that counts it accepted."""
        await self.redis.zrem(self.keys.leases, lease_id)

    async def epoch(self) -> str:
        """The id of Redis's data set (drawn by the first caller): it changes only when Redis lost
        its data (a restart without persistence), so counts saved under another one are void."""
        await self.redis.set(self.keys.epoch, uuid.uuid4().hex, nx=True)
        return (await self.redis.get(self.keys.epoch)).decode()

    async def version(self) -> int:
        return int(await self.redis.get(self.keys.version) or 0)

    async def set_version(self, version: int) -> None:
        await self.redis.set(self.keys.version, int(version))

    async def set_bound(self, bound: int) -> None:
        """The learner's side of ``auto``: the bound every ``try_start`` from now on enforces."""
        await self.redis.set(self.keys.bound, int(bound))

    async def set_consumed(self, total: int, version: int | None = None) -> int:
        """The learner's running total of groups taken by completed steps (never lowered), and,
        atomically with it, the version that step published."""
        k = self.keys
        args = [int(total), "" if version is None else int(version)]
        return int(await self._set_consumed(keys=[k.consumed, k.version], args=args))

    async def reset_consumed(self, total: int) -> None:
        """Overwrite the count: only after Redis lost it (restart without persistence)."""
        await self.redis.set(self.keys.consumed, int(total))

    async def counts(self) -> dict[str, int]:
        """accepted, consumed, discarded, trimmed, live leases (expired ones included until the
        next try_start), learner version and the capacity at the learner's version."""
        k = self.keys
        pipe = self.redis.pipeline(transaction=True)
        for key in (k.accepted, k.consumed, k.discarded, k.trimmed):
            pipe.get(key)
        pipe.zcard(k.leases)
        pipe.get(k.version)
        accepted, consumed, discarded, trimmed, leases, version = await pipe.execute()
        return {
            "accepted": int(accepted or 0),
            "consumed": int(consumed or 0),
            "discarded": int(discarded or 0),
            "trimmed": int(trimmed or 0),
            "leases": leases,
            "version": int(version or 0),
            "capacity": self.capacity,
        }
