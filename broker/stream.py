"""The rollout stream: producer (actors) and consumer (learner) over Redis consumer groups.

Delivery is at-least-once and de-duplicated by group id:
- a consumer re-reads its own pending entries (id ``0``) first, then new ones (``>``);
- entries idle longer than ``broker.claim_idle_ms`` on another consumer are taken
  with XAUTOCLAIM; the consumer keeps its own unacked entries fresh (XCLAIM JUSTID)
  so a learner that acks only at checkpoints is never robbed by a peer rank;
- an entry whose group id is already trained (``trained`` set) or in flight, with
  the same content (a payload digest, ``trained:digests``), is acked and skipped;
  other content under a held id is another group (written first by someone holding
  the password, to suppress the real one) and is trained under a qualified id;
- an entry that does not decode, breaks a limit of
  ``broker.semantics`` (group size, lengths, rewards, versions never announced),
  or was delivered ``broker.max_deliveries`` times without being trained (a
  sample that crashes training before every restart) goes to the dead-letter
  stream with the reason and is acked. Dead letters keep at most
  ``broker.dead_letter_payload_bytes`` of the payload, with its size and sha256;
- ``ack`` = XACK + XDEL + SADD trained in one MULTI, so the stream only holds
  unconsumed work, its length is the backlog, and a MAXLEN trim loses only
  entries nobody acked (counted, and released from admission).

Admission accounting (docs/architecture.md, "Admission control"): ``publish``
counts ``adm:accepted`` in the same script as the XADD (and drops the group's
lease) and counts entries a MAXLEN trim removed unread into ``adm:trimmed``;
entries acked without training (dead-lettered, duplicates, deleted while
pending) are counted into ``adm:discarded`` by the script that acks them. The
learner counts the groups its completed steps took (``Admission.set_consumed``);
``read`` itself counts nothing, so a read that is retried or whose reader dies
leaks no admission slot.
"""

from __future__ import annotations

import hashlib
import logging
import time
from dataclasses import dataclass

import redis
import redis.asyncio

from streamrl.broker import metrics
from streamrl.broker.client import as_str
from streamrl.broker.keys import Keys
from streamrl.broker.semantics import Limits, check_group
from streamrl.broker.wire import RolloutGroup, WireError, decode_group, encode_group
from streamrl.configs.schema import BrokerConfig

log = logging.getLogger(__name__)

DEAD_LETTER_MAXLEN = 10_000
# arguments per script call; Lua's unpack() stops near 8000
SCRIPT_CHUNK = 4000

# Lua keeps each step atomic and one round trip (a MULTI pipeline cost 3x the client CPU of XADD).
# redis.replicate_commands(): XADD '*' is non-deterministic; Redis 6.2 needs effect replication.

# KEYS: stream, accepted, trimmed, leases. ARGV: payload, maxlen, lease id ('' = none), consumer
# group. The trim is exact, so only the oldest entries beyond maxlen go (one per XADD once full).
# Trimmed entries were never acked (acked ones are deleted). Those the learner never read are
# counted into `trimmed` here, else their admission slots would leak forever; those it read (id at
# most the group's last-delivered-id) it still holds and counts with its step.
_PUBLISH = """
redis.replicate_commands()
local before = redis.call('XLEN', KEYS[1])
local doomed = {}
if before >= tonumber(ARGV[2]) then
  doomed = redis.call('XRANGE', KEYS[1], '-', '+', 'COUNT', before + 1 - tonumber(ARGV[2]))
end
local id = redis.call('XADD', KEYS[1], 'MAXLEN', ARGV[2], '*', 'g', ARGV[1])
local trimmed = before + 1 - redis.call('XLEN', KEYS[1])
redis.call('INCR', KEYS[2])
if trimmed > 0 then
  local last = nil
  for _, g in ipairs(redis.call('XINFO', 'GROUPS', KEYS[1])) do
    local f = {}
    for i = 1, #g, 2 do f[g[i]] = g[i + 1] end
    if f['name'] == ARGV[4] then last = f['last-delivered-id'] end
  end
  local function split(s)
    local ms, seq = string.match(s, '^(%d+)-(%d+)$')
    return tonumber(ms), tonumber(seq)
  end
  local unread = 0
  for i = 1, math.min(trimmed, #doomed) do
    local ms, seq = split(doomed[i][1])
    local lms, lseq = 0, -1
    if last then lms, lseq = split(last) end
    if ms > lms or (ms == lms and seq > lseq) then unread = unread + 1 end
  end
  if unread > 0 then redis.call('INCRBY', KEYS[3], unread) end
end
if ARGV[3] ~= '' then redis.call('ZREM', KEYS[4], ARGV[3]) end
return {id, trimmed}
"""

# KEYS: trained, trained digests. ARGV: (group id, qualified id) pairs. Returns per pair: whether
# each is trained, and the content digest recorded for the group id ('' = none).
_TRAINED = """
local out = {}
for i = 1, #ARGV, 2 do
  out[#out + 1] = redis.call('SISMEMBER', KEYS[1], ARGV[i])
  out[#out + 1] = redis.call('SISMEMBER', KEYS[1], ARGV[i + 1])
  out[#out + 1] = redis.call('HGET', KEYS[2], ARGV[i]) or ''
end
return out
"""

# KEYS: stream, dead-letter stream, discarded. ARGV: consumer group, dead-letter maxlen, then
# (entry id, reason, payload head, payload size, payload sha256) rows; reason '' = drop without a
# dead letter. Each entry is dead-lettered and counted only if this call acked it, so a retry
# changes nothing.
_DISCARD = """
local n = 0
for i = 3, #ARGV, 5 do
  if redis.call('XACK', KEYS[1], ARGV[1], ARGV[i]) == 1 then
    n = n + 1
    if ARGV[i + 1] ~= '' then
      redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[2], '*', 'g', ARGV[i + 2], 'size', ARGV[i + 3],
        'sha256', ARGV[i + 4], 'reason', ARGV[i + 1], 'source_id', ARGV[i])
    end
  end
  redis.call('XDEL', KEYS[1], ARGV[i])
end
if n > 0 then redis.call('INCRBY', KEYS[3], n) end
return n
"""

# KEYS: stream, trained, consumed. ARGV: consumer group, n, consumed total ('' = leave it), n entry
# ids, then group ids. The consumed total is set only if larger (see broker.admission), so acking a
# step and counting it are one atomic, repeatable step.
_ACK = """
local n = tonumber(ARGV[2])
if n > 0 then
  redis.call('XACK', KEYS[1], ARGV[1], unpack(ARGV, 4, 3 + n))
  redis.call('XDEL', KEYS[1], unpack(ARGV, 4, 3 + n))
end
if #ARGV > 3 + n then redis.call('SADD', KEYS[2], unpack(ARGV, 4 + n)) end
if ARGV[3] ~= '' and tonumber(ARGV[3]) > tonumber(redis.call('GET', KEYS[3]) or '0') then
  redis.call('SET', KEYS[3], ARGV[3])
end
return n
"""


@dataclass
class Delivery:
    entry_id: str
    group: RolloutGroup
    redelivered: bool = False


# hex digits of a payload's sha256 that tell two groups under one id apart
DIGEST_CHARS = 16


def content_digest(payload: bytes) -> str:
    return hashlib.sha256(payload).hexdigest()[:DIGEST_CHARS]


def qualified_id(group_id: str, digest: str) -> str:
    """The id a group is trained under when another group with other content already holds its
    id (written first by someone holding the password): the forged one cannot suppress it."""
    return f"{group_id}~{digest}"


def _first_of_each(raw: list[tuple[str, dict | None, bool]]) -> list[tuple[str, dict | None, bool]]:
    """Drop repeats of an entry id: a pending re-read and a claim in one call can both return it."""
    seen: set[str] = set()
    out = []
    for entry in raw:
        if entry[0] not in seen:
            seen.add(entry[0])
            out.append(entry)
    return out


class RolloutProducer:
    """XADDs encoded groups. One per actor process; safe to share between tasks of one loop."""

    def __init__(self, redis_client: redis.asyncio.Redis, keys: Keys, broker: BrokerConfig):
        self.redis = redis_client
        self.keys = keys
        self.maxlen = broker.maxlen
        self.group = broker.consumer_group
        self._publish = redis_client.register_script(_PUBLISH)

    async def publish(self, group: RolloutGroup, lease_id: str | None = None) -> str:
        """Append one group and count it accepted; with ``lease_id`` its admission lease is dropped
        in the same atomic step, so a crash can neither lose nor double-count it."""
        return await self.publish_encoded(encode_group(group), lease_id)

    async def publish_encoded(self, payload: bytes, lease_id: str | None = None) -> str:
        k = self.keys
        entry_id, trimmed = await self._publish(
            keys=[k.stream, k.accepted, k.trimmed, k.leases],
            args=[payload, self.maxlen, lease_id or "", self.group],
        )
        metrics.STREAM_PRODUCED.inc()
        if trimmed > 0:
            metrics.STREAM_TRIMMED.inc(trimmed)
            log.warning(
                "MAXLEN %d trimmed %d unconsumed entries (admission bypassed?)",
                self.maxlen,
                trimmed,
            )
        return as_str(entry_id)


class RolloutConsumer:
    """One learner rank's reader. ``read`` never raises for bad data; Redis errors surface after retries."""

    def __init__(
        self,
        redis_client: redis.asyncio.Redis,
        keys: Keys,
        broker: BrokerConfig,
        limits: Limits,
        consumer: str,
        vocab_size: int | None = None,
    ):
        self.redis = redis_client
        self.keys = keys
        self.group = broker.consumer_group
        self.consumer = consumer
        self.vocab_size = vocab_size
        self.max_entry_bytes = broker.max_entry_bytes
        self.claim_idle_ms = broker.claim_idle_ms
        self.limits = limits
        self.max_deliveries = broker.max_deliveries
        self.dead_letter_payload_bytes = broker.dead_letter_payload_bytes
        # None until the learner says: versions unchecked
        self.max_version: int | None = None
        self._group_ready = False
        # times Redis lost the group (restart without persistence), and the counters with it
        self.group_recreated = 0
        # None once our own pending entries are re-read
        self._pending_cursor: str | None = "0"
        self._claim_cursor = "0-0"
        self._last_claim = 0.0
        self._last_touch = time.monotonic()
        self._last_gauges = 0.0
        # group id -> entry id, delivered and not yet acked
        self._inflight: dict[str, str] = {}
        # entry id -> (group id, content digest) of what this consumer delivered, for the ack
        self._digests: dict[str, tuple[str, str]] = {}
        self._trained = redis_client.register_script(_TRAINED)
        self._discard = redis_client.register_script(_DISCARD)
        self._ack = redis_client.register_script(_ACK)

    def set_max_version(self, version: int) -> None:
        """The learner announced ``version``: entries with tokens of a later one are forged."""
        self.max_version = max(version, self.max_version or 0)

    async def start_version_check(self, version: int) -> None:
        """Check versions from now on against ``version`` or the highest one announced before
        (a restarted learner resumes below what its predecessor's actors may hold)."""
        raw = await self.redis.get(self.keys.version)
        try:
            announced = int(raw or 0)
        # anyone with the password can write the key: a value that is no version is not one
        except ValueError:
            log.warning("ignoring %s=%r: not a version", self.keys.version, raw[:80])
            announced = 0
        self.set_max_version(max(version, announced))

    async def ensure_group(self) -> None:
        try:
            await self.redis.xgroup_create(self.keys.stream, self.group, id="0", mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        self._group_ready = True

    async def _with_group(self, call):
        if not self._group_ready:
            await self.ensure_group()
        try:
            return await call()
        except redis.ResponseError as exc:
            if "NOGROUP" not in str(exc):
                raise
        # Redis restarted without persistence: the group (and our pending list) is gone.
        log.warning("consumer group %s vanished (Redis restart?); recreating it", self.group)
        self.group_recreated += 1
        await self.ensure_group()
        self._pending_cursor = None
        return await call()

    async def read(self, count: int, block_ms: int) -> list[Delivery]:
        """Up to ``count`` valid, not-yet-trained groups; blocks at most ``block_ms`` when none is ready."""
        raw: list[tuple[str, dict | None, bool]] = []
        await self._with_group(self._touch_inflight)
        if self._pending_cursor is not None:
            raw += await self._with_group(lambda: self._read_own_pending(count))
        if len(raw) < count and time.monotonic() - self._last_claim >= self.claim_idle_ms / 2000.0:
            raw += await self._with_group(lambda: self._claim_idle(count - len(raw)))
        if len(raw) < count:
            block = None if raw else block_ms
            raw += await self._with_group(lambda: self._read_new(count - len(raw), block))
        deliveries = await self._sort(_first_of_each(raw))
        await self._with_group(self._update_gauges)
        return deliveries

    async def _read_own_pending(self, count: int) -> list[tuple[str, dict | None, bool]]:
        reply = await self.redis.xreadgroup(
            self.group, self.consumer, {self.keys.stream: self._pending_cursor}, count=count
        )
        entries = reply[0][1] if reply else []
        if not entries:
            self._pending_cursor = None
            return []
        self._pending_cursor = as_str(entries[-1][0])
        return self._not_held(entries)

    def _not_held(self, entries) -> list[tuple[str, dict | None, bool]]:
        # Our own unacked entries come back from a pending re-read or a claim: we still hold them.
        held = set(self._inflight.values())
        return [(as_str(eid), fields, True) for eid, fields in entries if as_str(eid) not in held]

    async def _claim_idle(self, count: int) -> list[tuple[str, dict | None, bool]]:
        self._last_claim = time.monotonic()
        reply = await self.redis.xautoclaim(
            self.keys.stream,
            self.group,
            self.consumer,
            min_idle_time=self.claim_idle_ms,
            start_id=self._claim_cursor,
            count=count,
        )
        self._claim_cursor = as_str(reply[0])
        # Redis 7 lists deleted entries separately (and drops them from the PEL); 6.2 returns (id, None).
        return self._not_held(reply[1])

    async def _read_new(self, count: int, block: int | None) -> list[tuple[str, dict | None, bool]]:
        reply = await self.redis.xreadgroup(
            self.group, self.consumer, {self.keys.stream: ">"}, count=count, block=block
        )
        entries = reply[0][1] if reply else []
        return [(as_str(eid), fields, False) for eid, fields in entries]

    async def _sort(self, raw: list[tuple[str, dict | None, bool]]) -> list[Delivery]:
        """Decode; dead-letter the bad, skip the duplicate, return the rest."""
        if not raw:
            return []
        decoded: list[tuple[str, RolloutGroup, bool, str]] = []
        # acked and deleted without training
        drop: list[str] = []
        dead: list[tuple[str, bytes, str]] = []
        deliveries_of = await self._delivery_counts([e for e, _, again in raw if again])
        for entry_id, fields, redelivered in raw:
            if redelivered:
                metrics.STREAM_REDELIVERED.inc()
            # deleted or trimmed while pending
            if not fields:
                drop.append(entry_id)
                continue
            payload = fields.get(b"g")
            try:
                if payload is None:
                    raise WireError(
                        f"entry has no 'g' field (fields: {sorted(k.decode(errors='replace') for k in fields)})"
                    )
                if deliveries_of.get(entry_id, 1) >= self.max_deliveries:
                    raise WireError(
                        f"delivered {deliveries_of[entry_id]} times without being trained "
                        f"(broker.max_deliveries={self.max_deliveries})"
                    )
                group = decode_group(payload, self.vocab_size, self.max_entry_bytes)
                check_group(group, self.limits, self.max_version)
            except WireError as exc:
                dead.append((entry_id, payload or b"", str(exc)))
                continue
            decoded.append((entry_id, group, redelivered, content_digest(payload)))

        fresh = sum(not redelivered for _, _, redelivered in raw)
        metrics.STREAM_CONSUMED.inc(fresh)
        pairs = [x for _, g, _, d in decoded for x in (g.group_id, qualified_id(g.group_id, d))]
        found = []
        # whole pairs per call
        step = 2 * max(1, SCRIPT_CHUNK // 2)
        for i in range(0, len(pairs), step):
            found += await self._trained(
                keys=[self.keys.trained, self.keys.trained_digests], args=pairs[i : i + step]
            )
        deliveries = []
        for i, (entry_id, group, redelivered, digest) in enumerate(decoded):
            trained, qualified_trained, trained_digest = found[3 * i : 3 * i + 3]
            key = self._dedup_key(
                group.group_id, digest, bool(trained), as_str(trained_digest) or None
            )
            if key is None or qualified_trained and key != group.group_id:
                metrics.STREAM_DUPLICATES.inc()
                drop.append(entry_id)
                continue
            if key != group.group_id:
                log.warning(
                    "entry %s reuses group id %r of another group (other content): trained as %r",
                    entry_id,
                    group.group_id,
                    key,
                )
                group.group_id = key
            self._inflight[key] = entry_id
            self._digests[entry_id] = (key, digest)
            deliveries.append(Delivery(entry_id, group, redelivered))
        if dead or drop:
            await self._dead_letter_and_drop(dead, drop)
        return deliveries

    def _dedup_key(
        self, group_id: str, digest: str, trained: bool, trained_digest: str | None
    ) -> str | None:
        """The id to train a group under, or None for a duplicate (the same content again: a
        redelivery, a retried XADD). A group whose id is held, trained or in flight, by a group
        with other content is another group: it gets its qualified id."""
        if group_id in self._inflight:
            held = self._digests.get(self._inflight[group_id], (group_id, digest))[1]
            if held == digest:
                return None
            qualified = qualified_id(group_id, digest)
            return None if qualified in self._inflight else qualified
        if not trained:
            return group_id
        # trained without a recorded digest (acked by a learner that had not delivered it):
        # nothing to tell it apart by, so a duplicate as before
        if trained_digest is None or trained_digest == digest:
            return None
        qualified = qualified_id(group_id, digest)
        return None if qualified in self._inflight else qualified

    async def _delivery_counts(self, entry_ids: list[str]) -> dict[str, int]:
        """Times each (re)delivered entry was delivered, from the consumer group's pending list."""
        if not entry_ids:
            return {}
        pipe = self.redis.pipeline(transaction=False)
        for entry_id in entry_ids:
            pipe.xpending_range(self.keys.stream, self.group, entry_id, entry_id, 1)
        counts = {}
        for entry_id, reply in zip(entry_ids, await pipe.execute(), strict=True):
            if reply:
                counts[entry_id] = int(reply[0]["times_delivered"])
        return counts

    def _dead_letter_fields(self, entry_id: str, payload: bytes, reason: str) -> dict:
        return {
            "g": payload[: self.dead_letter_payload_bytes],
            "size": len(payload),
            "sha256": hashlib.sha256(payload).hexdigest(),
            "reason": reason,
            "source_id": entry_id,
        }

    async def _dead_letter_and_drop(
        self, dead: list[tuple[str, bytes, str]], drop: list[str]
    ) -> None:
        """Ack entries that will not be trained, counting them in ``adm:discarded`` (admission)
        in the same script, so each is counted exactly once however often this is retried."""
        k = self.keys
        for entry_id, _, reason in dead:
            log.warning("dead-lettering entry %s: %s", entry_id, reason)
        fields = [self._dead_letter_fields(e, payload, reason) for e, payload, reason in dead]
        rows = [
            (f["source_id"], f["reason"] or "invalid", f["g"], f["size"], f["sha256"])
            for f in fields
        ]
        rows += [(e, "", b"", 0, "") for e in drop]
        for i in range(0, len(rows), SCRIPT_CHUNK // 5):
            args = [self.group, DEAD_LETTER_MAXLEN]
            for row in rows[i : i + SCRIPT_CHUNK // 5]:
                args += row
            await self._with_group(
                lambda args=args: self._discard(keys=[k.stream, k.dead, k.discarded], args=args)
            )
        metrics.STREAM_DEAD_LETTER.inc(len(dead))

    async def ack(
        self, entry_ids: list[str], group_ids: list[str], consumed: int | None = None
    ) -> None:
        """The step that used these entries is committed: XACK + XDEL + mark trained, atomically;
        with ``consumed``, also the learner's running total for admission (set only if larger)."""
        if not entry_ids and not group_ids and consumed is None:
            return
        k = self.keys
        if len(entry_ids) + len(group_ids) > SCRIPT_CHUNK:
            # Too many for one script: mark trained first, so a crash half-way through the acks
            # leaves redeliveries that are recognised and skipped, never trained twice.
            for i in range(0, len(group_ids), SCRIPT_CHUNK):
                await self.redis.sadd(k.trained, *group_ids[i : i + SCRIPT_CHUNK])
            chunks = [
                (entry_ids[i : i + SCRIPT_CHUNK], [])
                for i in range(0, len(entry_ids), SCRIPT_CHUNK)
            ]
        else:
            chunks = [(entry_ids, group_ids)]
        total = "" if consumed is None else int(consumed)
        for i, (entries, groups) in enumerate(chunks):
            # the count goes with the first chunk: a crash after it can over-count (the rest come
            # back as duplicates and are discarded, counted again), never leak a slot
            count = total if i == 0 else ""
            args = [self.group, len(entries), count, *entries, *groups]
            # Idempotent, so the retry after a NOGROUP (Redis restarted without persistence) is safe.
            await self._with_group(
                lambda args=args: self._ack(keys=[k.stream, k.trained, k.consumed], args=args)
            )
        # after the ack: a crash in between leaves the digest unrecorded, and a later group reusing
        # the id is then dropped as a duplicate, as before digests were kept
        digests = [self._digests.pop(e, None) for e in entry_ids]
        known = {gid: d for gid, d in filter(None, digests)}
        for i in range(0, len(known), SCRIPT_CHUNK):
            chunk = list(known.items())[i : i + SCRIPT_CHUNK]
            pipe = self.redis.pipeline(transaction=False)
            for gid, digest in chunk:
                pipe.hsetnx(k.trained_digests, gid, digest)
            await pipe.execute()
        for gid in group_ids:
            self._inflight.pop(gid, None)

    async def _touch_inflight(self) -> None:
        """Reset the idle time of our unacked entries so no other consumer claims them."""
        if not self._inflight or time.monotonic() - self._last_touch < self.claim_idle_ms / 3000.0:
            return
        self._last_touch = time.monotonic()
        await self.redis.xclaim(
            self.keys.stream,
            self.group,
            self.consumer,
            0,
            list(self._inflight.values()),
            justid=True,
        )

    async def _update_gauges(self) -> None:
        now = time.monotonic()
        if now - self._last_gauges < 1.0:
            return
        self._last_gauges = now
        pipe = self.redis.pipeline(transaction=False)
        pipe.xlen(self.keys.stream)
        pipe.xpending(self.keys.stream, self.group)
        length, pending = await pipe.execute()
        metrics.STREAM_LENGTH.set(length)
        metrics.STREAM_PENDING.set(pending["pending"])
