"""The ``shm`` transport: POSIX shared memory on one host.

The publisher writes each version into a free slot of its segment and announces the segment and
slot; a receiver copies the announced slot into the staging copy under a lease.

- ``segment``: the segment file, its header, version stamps (seqlock) and reader leases, and the
  cleanup of segments a killed process left (the ``cuda_ipc`` transport's control segment is one
  of another kind);
- ``checksum``: the per-tensor checksums a reader checks on the bytes it holds;
- ``slots``: ``ShmWriter``/``ShmReader``, a version's tensors and checksum table in a slot;
- ``sender``, ``receiver``: the transport's two ends.

Imports nothing heavy: the modules above are imported where a sender or receiver is made.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import Field

from streamrl.configs.section import Section
from streamrl.weightsync.transports.base import Transport

if TYPE_CHECKING:
    import redis

    from streamrl.broker.keys import Keys
    from streamrl.configs.weightsync import WeightSyncConfig
    from streamrl.weightsync.layout import Layout
    from streamrl.weightsync.transports.shm.receiver import ShmReceiver
    from streamrl.weightsync.transports.shm.sender import ShmSender


class Options(Section):
    """The ``shm`` transport's segment (``weightsync.shm``)."""

    slots: int = Field(
        3,
        ge=2,
        description="Ring of slots in the segment, so the publisher never overwrites a slot a reader is copying.",
    )


class Shm(Transport):
    name = "shm"
    summary = "POSIX shared memory (one host)"
    options = Options
    publishes = True
    shared_memory = True
    device_ipc = False
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
        from streamrl.weightsync.transports.shm.sender import ShmSender
        from streamrl.weightsync.transports.shm.slots import ShmWriter

        return ShmSender(ShmWriter(keys.run_name, layout, ws.shm.slots, ws.timeout_s))

    def receiver(
        self, ws: WeightSyncConfig, client: redis.Redis, keys: Keys, actor_id: str
    ) -> ShmReceiver:
        from streamrl.weightsync.transports.shm.receiver import ShmReceiver

        return ShmReceiver(ws.timeout_s, keys.run_name)

    def describe(self, meta: dict, run_name: str | None = None) -> dict:
        """The readers copying a slot of the segment right now; a name that is not one of
        ``run_name``'s segments is shown refused, never opened."""
        from streamrl.weightsync.transports.shm.segment import active_leases

        try:
            segment = meta.get("segment") if isinstance(meta, dict) else None
            return {"readers_copying": active_leases(segment, run_name)}
        except FileNotFoundError:
            return {"readers_copying": "segment gone (publisher exited)"}
        # SegmentNameError among them: a name that is not a segment's, never opened
        except ValueError as exc:
            return {"readers_copying": None, "segment_refused": str(exc)}


TRANSPORT = Shm()
