"""A member's side of the dist transport: ``DistReceiver`` joins each epoch's group it is invited to
and receives every broadcast (an actor's, or a host relay's with its own destination), and
``DistTransportReceiver`` is the subscriber's receiver over it."""

from __future__ import annotations

import datetime as dt
import time

import redis
import torch
import torch.distributed as tdist

from streamrl.broker.keys import Keys
from streamrl.broker.server import is_loopback
from streamrl.weightsync.layout import Layout
from streamrl.weightsync.naming import NameMappingError
from streamrl.weightsync.transports.base import Staging, TransferTimeout
from streamrl.broker.netaddr import toward
from streamrl.weightsync.transports.dist.buckets import as_bytes, bucket_sizes, windows
from streamrl.weightsync.transports.dist.group import bounded, device_of, make_group
from streamrl.weightsync.transports.dist.trust import (
    Header,
    Refused,
    count_refused,
    epoch_secret,
    group_record,
    header,
    members,
    verify,
)

# how long one step waits for the next broadcast before it looks for a new epoch
STEP_WAIT_S = 0.2
# how often a member reads a refused value again, waiting for the learner's own to replace it
SIGNED_POLL_S = 0.02


class DistReceiver:
    """Member side, driven by the subscriber's (or the relay's) loop through ``step``."""

    def __init__(self, client: redis.Redis, keys: Keys, actor_id: str, *, timeout_s: float):
        self.client, self.keys, self.actor_id = client, keys, actor_id
        self.timeout_s = timeout_s
        self.bucket = torch.empty(0, dtype=torch.uint8)
        self.epoch: int | None = None
        # the newest group record acted on (joined, left out of, or failed to join)
        self.seen = -1
        self.store = None
        self.group = None
        self.device = torch.device("cpu")
        self.seq = 0
        # the publisher id and shm checksums (None: not sent) of the version being received
        self.publisher = ""
        self.checksums: list[int] | None = None
        # the epoch's HMAC secret, from Redis (trust), and what was refused (counted once each)
        self.secret: bytes | None = None
        self.refused = 0
        self._bad_record: bytes | None = None
        self._bad_header: bytes | None = None
        self._next_beat = 0.0
        # when (time.time()) the last version received passed each phase (the relay's log)
        self.marks: dict[str, float] = {}

    def heartbeat(self, now: bool = False) -> None:
        t = time.time()
        # the epoch whose group this member is in: a member restarted under the same id is in none
        joined = -1 if self.epoch is None else self.epoch
        if now or t >= self._next_beat:
            self.client.hset(
                self.keys.weights_dist_members, self.actor_id, f"{t + self.timeout_s} {self.seen} {joined}"
            )
            self._next_beat = t + self.timeout_s / 4

    def _leave(self) -> None:
        self.group = self.store = None
        self.epoch = None

    def _join_if_listed(self) -> None:
        raw = self.client.get(self.keys.weights_dist_group)
        if raw is None or raw == self._bad_record:
            return
        try:
            record = group_record(raw)
        except Refused as exc:
            self._bad_record = raw
            self._refuse(exc)
            return
        # (not <=: a Redis that lost its data restarts the count)
        if record.epoch == self.seen:
            return
        self._leave()
        self.seen = epoch = record.epoch
        if self.actor_id not in record.members:
            # tells the publisher this member is alive and listening again (after being dropped)
            self.heartbeat(now=True)
            return
        self.secret = epoch_secret(self.client, self.keys, epoch)
        if self.secret is None:
            self._refuse(Refused("no_secret", f"epoch {epoch} has no secret in Redis"))
            self.heartbeat(now=True)
            return
        timeout = dt.timedelta(seconds=self.timeout_s)
        with bounded(f"connecting to epoch {epoch}'s store", self.timeout_s):
            store = tdist.TCPStore(record.host, record.port, is_master=False, timeout=timeout)
        # an epoch formed already (listing this member's previous process, after a restart) is not
        # joined: the heartbeat says so, and the publisher takes this member in again
        checked_in = not store.check([f"e{epoch}/final"])
        if checked_in:
            store.set(f"e{epoch}/ready/{self.actor_id}", "1")
        # the publisher writes the final list within timeout_s of the record; a member that checked
        # in just in time waits a little longer than that
        final = members(self._signed(store, f"e{epoch}/final", 2 * self.timeout_s))
        self.heartbeat(now=True)
        if not checked_in or self.actor_id not in final:
            return
        self.device = device_of(record.backend)
        publisher_host = record.host
        local = publisher_host if is_loopback(publisher_host) else toward(publisher_host)
        with bounded(f"forming epoch {epoch}'s group", self.timeout_s):
            self.group = make_group(
                record.backend,
                tdist.PrefixStore(f"e{epoch}/pg/", store),
                final.index(self.actor_id) + 1,
                len(final) + 1,
                self.timeout_s,
                local or publisher_host,
            )
        self.store, self.epoch, self.seq = store, epoch, 0
        self.heartbeat(now=True)

    def _signed(self, store: tdist.TCPStore, key: str, within_s: float) -> object:
        """The value the learner signed under ``key``, waiting up to ``within_s`` for it: a value
        someone else put there first is refused, and read again until the learner's replaces it."""
        deadline = time.monotonic() + within_s
        with bounded(f"waiting for {key}", within_s):
            store.wait([key], dt.timedelta(seconds=within_s))
        while True:
            try:
                return verify(self.secret, key, store.get(key))
            except Refused as exc:
                self._refuse(exc)
            if time.monotonic() >= deadline:
                raise TransferTimeout(f"{key}: nothing the learner signed within {within_s:g} s")
            time.sleep(SIGNED_POLL_S)

    def _refuse(self, exc: Refused) -> None:
        self.refused += 1
        count_refused(exc.kind, str(exc))

    def _header(self, key: str) -> Header | None:
        """The header the learner signed under ``key``, or None (refused: read again next step)."""
        raw = self.store.get(key)
        try:
            return header(verify(self.secret, key, raw))
        except Refused as exc:
            # counted once per value: it stays until the learner's own header replaces it
            if raw != self._bad_header:
                self._bad_header = raw
                self._refuse(exc)
            return None

    def _sums_after(self, key: str, head: Header) -> list[int] | None:
        """The checksums of a version whose header came without them: the learner signs the same
        header with them once its slot holds them all, while the broadcast is under way."""
        after = header(self._signed(self.store, f"{key}/sums", self.timeout_s))
        if after.version != head.version or after.layout != head.layout:
            raise Refused("malformed", f"{key}/sums is not {key}'s header with its checksums")
        return after.checksums

    def step(self, wait_s: float, acquire, release) -> int | None:
        """Join a new epoch if listed, then wait up to ``wait_s`` for the next publish and receive it.

        ``acquire(version, layout, aliases)`` returns destination tensors by
        published name, or one flat uint8 tensor to take the layout's byte stream as it is (a shm
        slot), or None to receive and drop (staging busy); ``release(version, ok)`` is called
        after. Returns the version received. Only what the learner signed is acted on
        (``trust``): anything else in its place is refused, counted, and waited past.
        """
        self.heartbeat()
        self._join_if_listed()
        if self.group is None:
            time.sleep(wait_s)
            return None
        key = f"e{self.epoch}/pub/{self.seq}"
        try:
            self.store.wait([key], dt.timedelta(seconds=wait_s))
            head = self._header(key)
        except tdist.DistNetworkError:
            # the publisher (and its store) is gone: wait for a new epoch
            self._leave()
            return None
        # timeout: nothing published yet
        except tdist.DistStoreError:
            return None
        if head is None:
            time.sleep(wait_s)
            return None
        self.seq += 1
        self.marks = {"header": time.time()}
        self.publisher, self.checksums = head.publisher, head.checksums
        dest = acquire(head.version, head.layout, head.aliases)
        self.marks["slot"] = time.time()
        ok = False
        try:
            self._receive(head.layout, head.bucket_bytes, dest)
            self.marks["received"] = time.time()
            if isinstance(dest, torch.Tensor) and head.checksums is None:
                self.checksums = self._sums_after(key, head)
            ok = dest is not None
        except Exception:
            self._leave()
            raise
        finally:
            release(head.version, ok)
        return head.version if ok else None

    def _receive(
        self,
        layout: Layout,
        bucket_bytes: int,
        dest: dict[str, torch.Tensor] | torch.Tensor | None,
    ) -> None:
        sizes = bucket_sizes(layout, bucket_bytes)
        if self.bucket.device != self.device or self.bucket.numel() < max(sizes, default=0):
            self.bucket = torch.empty(max(sizes, default=0), dtype=torch.uint8, device=self.device)
        bucket = self.bucket
        timeout = dt.timedelta(seconds=self.timeout_s)
        flat = dest if isinstance(dest, torch.Tensor) else None
        targets = (
            {name: as_bytes(t) for name, t in dest.items()} if isinstance(dest, dict) else None
        )
        # broadcasts straight into the destination are all posted at once, the others one by one
        direct = []
        for index, (size, window) in enumerate(
            zip(sizes, windows(layout, bucket_bytes), strict=True)
        ):
            into = (
                None if flat is None else flat[index * bucket_bytes : index * bucket_bytes + size]
            )
            # straight into the flat destination when it lies on the group's device
            chunk = into if into is not None and into.device == self.device else bucket[:size]
            work = self.group.broadcast([chunk], tdist.BroadcastOptions())
            if chunk is into:
                direct.append(work)
                continue
            with bounded(f"epoch {self.epoch} broadcast", self.timeout_s):
                work.wait(timeout)
            if into is not None:
                into.copy_(chunk)
            if targets is None:
                continue
            for name, start, end, at in window:
                if name in targets:
                    targets[name][start:end].copy_(chunk[at : at + end - start])
        for work in direct:
            with bounded(f"epoch {self.epoch} broadcast", self.timeout_s):
                work.wait(timeout)

    def close(self) -> None:
        try:
            self.client.hdel(self.keys.weights_dist_members, self.actor_id)
        except redis.RedisError:
            # Redis gone too: the heartbeat expires on its own
            pass
        self._leave()


class DistTransportReceiver:
    """The subscriber's receiver: each broadcast straight into the staging copy, or dropped (still
    taking part, so the publisher is not stalled) when the copy is busy or the names do not map."""

    def __init__(self, receiver: DistReceiver, timeout_s: float):
        self.receiver = receiver
        self.timeout_s = timeout_s

    def step(self, staging: Staging) -> float:
        started = 0.0
        filling = False

        def acquire(version: int, layout: Layout, aliases: dict[str, str]):
            nonlocal started, filling
            started = time.perf_counter()
            # a broadcast is always the newest version; the engine's swap takes milliseconds, so wait a
            # little for it rather than drop the version (the broadcast is under way anyway)
            try:
                fill = staging.begin_fill(layout, aliases, wait_s=min(1.0, self.timeout_s / 4))
            except NameMappingError as exc:
                # still take part in the broadcast (dropping the bytes) so the publisher is not stalled
                staging.fail("name_mismatch", str(exc))
                return None
            if fill is None:
                staging.fail("staging_busy")
                return None
            filling = True
            return {source: fill.tensors[engine] for engine, source in fill.pairs}

        def release(version: int, ok: bool) -> None:
            if not filling:
                return
            ann = staging.announced
            publisher = ann.publisher if ann is not None else None
            if ok:
                staging.end_fill(version, publisher, time.perf_counter() - started)
            else:
                staging.end_fill(None, publisher)

        try:
            self.receiver.step(STEP_WAIT_S, acquire, release)
        except TransferTimeout as exc:
            staging.fail("timeout", repr(exc))
        except Exception as exc:
            staging.fail("error", repr(exc))
        # the step itself waited for the next broadcast
        return 0.0

    def close(self) -> None:
        self.receiver.close()
