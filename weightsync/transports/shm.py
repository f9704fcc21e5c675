"""The ``shm`` transport: POSIX shared memory on one host (the segment code is ``weightsync.shm``).

The publisher writes each version into a free slot of its segment and announces the segment and
slot; a receiver copies the announced slot into the staging copy under a lease.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from streamrl.weightsync import metrics
from streamrl.weightsync.layout import Layout
from streamrl.weightsync.naming import NameMappingError
from streamrl.weightsync.transports.base import Staging, Transport

if TYPE_CHECKING:
    import redis
    import torch

    from streamrl.broker.keys import Keys
    from streamrl.configs.schema import WeightSyncConfig
    from streamrl.weightsync.shm import ShmReader, ShmWriter

# re-read the announcement at least this often even without a notification
IDLE_WAIT_S = 1.0
# a newer version is pending while the engine holds the staging copy
BUSY_WAIT_S = 0.02
# stale/torn reads retried at once with the newest announcement
RETRIES = 3


class ShmSender:
    def __init__(self, writer: ShmWriter):
        self.writer = writer

    def send(
        self,
        version: int,
        tensors: dict[str, torch.Tensor],
        aliases: dict[str, str],
        checksums: dict[str, int] | None = None,
    ) -> dict:
        slot, overrode = self.writer.write(version, tensors, checksums)
        if overrode:
            metrics.TRANSFER_FAILURES.labels(reason="lease_timeout").inc()
        return {"segment": self.writer.name, "slot": slot}

    def close(self) -> None:
        self.writer.close()


class ShmReceiver:
    def __init__(self, timeout_s: float):
        self.timeout_s = timeout_s
        self.reader: ShmReader | None = None

    # whether the staging copy is asked for as one buffer (``Staging.begin_fill``'s ``flat``)
    FLAT = False

    def step(self, staging: Staging) -> float:
        return BUSY_WAIT_S if self._receive(staging) else IDLE_WAIT_S

    def _read(self, staging: Staging, version: int, slot: int, layout: Layout, dest: dict) -> str:
        """Copy ``version`` from ``slot`` into ``dest``: the reader's "ok", "stale" or "torn"."""
        return self.reader.read_into(version, slot, layout, staging.pairs, dest)

    def _receive(self, staging: Staging) -> bool:
        """Receive the newest announced version if wanted; returns True if one is still pending."""
        for _ in range(RETRIES):
            ann = staging.announced
            if not staging.wanted(ann):
                return False
            layout = Layout.from_json(ann.meta["layout"])
            if not self._open(staging, ann):
                return False
            start = time.perf_counter()
            try:
                dest = staging.begin_fill(layout, ann.meta["aliases"], flat=self.FLAT)
            except NameMappingError as exc:
                staging.skip(ann)
                staging.fail("name_mismatch", str(exc))
                return False
            if dest is None:
                return True
            result = "error"
            try:
                result = self._read(staging, ann.version, int(ann.meta["slot"]), layout, dest)
            finally:
                staging.end_fill(ann.version if result == "ok" else None, ann.publisher)
            if result == "ok":
                staging.received(time.perf_counter() - start)
                return False
            staging.fail("torn" if result == "torn" else "stale_slot")
            staging.reread()
        return True

    def _open(self, staging: Staging, ann) -> bool:
        """Map the announced segment (once per publisher); False if it is gone."""
        from streamrl.weightsync.shm import ShmReader

        segment = ann.meta["segment"]
        if self.reader is not None and self.reader.name == segment:
            return True
        self.close()
        try:
            self.reader = ShmReader(segment, self.timeout_s)
        except FileNotFoundError:
            staging.skip(ann)
            staging.fail(
                "segment_gone",
                f"{segment} is gone (publisher exited); keeping version {staging.version}",
            )
            return False
        return True

    def close(self) -> None:
        if self.reader is not None:
            self.reader.close()
            self.reader = None


class Shm(Transport):
    name = "shm"
    shared_memory = True
    background = True

    def sender(
        self,
        ws: WeightSyncConfig,
        client: redis.Redis,
        keys: Keys,
        layout: Layout,
        *,
        publisher: str = "",
        host_id: str = "",
    ) -> ShmSender:
        from streamrl.weightsync.shm import ShmWriter

        return ShmSender(ShmWriter(keys.run_name, layout, ws.slots, ws.timeout_s))

    def receiver(
        self, ws: WeightSyncConfig, client: redis.Redis, keys: Keys, actor_id: str
    ) -> ShmReceiver:
        return ShmReceiver(ws.timeout_s)

    def describe(self, meta: dict) -> dict:
        """The readers copying a slot of the segment right now."""
        from streamrl.weightsync.shm import active_leases

        try:
            return {"readers_copying": active_leases(meta["segment"])}
        except FileNotFoundError:
            return {"readers_copying": "segment gone (publisher exited)"}


TRANSPORT = Shm()
