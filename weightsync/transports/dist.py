"""The ``dist`` transport: torch.distributed broadcast in buckets (NCCL on GPUs, gloo on CPU); the
group, rendezvous and bucket code is ``weightsync.dist``.

Every member of the publisher's current group receives each version as it is broadcast; the
announcement only says which epoch and members took part.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from streamrl.weightsync.layout import Layout
from streamrl.weightsync.naming import NameMappingError
from streamrl.weightsync.transports.base import Staging, TransferTimeout, Transport

if TYPE_CHECKING:
    import redis

    from streamrl.broker.keys import Keys
    from streamrl.configs.schema import WeightSyncConfig
    from streamrl.weightsync.dist import DistReceiver, DistSender

# how long one step waits for the next broadcast before it looks for a new epoch
STEP_WAIT_S = 0.2


class DistTransportReceiver:
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
            # little for it rather than drop the version (the publisher waits for every member anyway)
            try:
                dest = staging.begin_fill(layout, aliases, wait_s=min(1.0, self.timeout_s / 4))
            except NameMappingError as exc:
                # still take part in the broadcast (dropping the bytes) so the publisher is not stalled
                staging.fail("name_mismatch", str(exc))
                return None
            if dest is None:
                staging.fail("staging_busy")
                return None
            filling = True
            return {source: dest[engine] for engine, source in staging.pairs}

        def release(version: int, ok: bool) -> None:
            ann = staging.announced
            if ok:
                staging.received(time.perf_counter() - started)
            if filling:
                staging.end_fill(
                    version if ok else None, ann.publisher if ann is not None else None
                )

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


class Dist(Transport):
    name = "dist"
    process_group = True

    def sender(
        self, ws: WeightSyncConfig, client: redis.Redis, keys: Keys, layout: Layout
    ) -> DistSender:
        from streamrl.weightsync.dist import DistSender

        return DistSender(
            client,
            keys,
            layout,
            bucket_bytes=ws.bucket_bytes,
            timeout_s=ws.timeout_s,
            backend=ws.backend,
            host=ws.dist_host,
        )

    def receiver(
        self, ws: WeightSyncConfig, client: redis.Redis, keys: Keys, actor_id: str
    ) -> DistTransportReceiver:
        from streamrl.weightsync.dist import DistReceiver

        return DistTransportReceiver(
            DistReceiver(client, keys, actor_id, timeout_s=ws.timeout_s), ws.timeout_s
        )


TRANSPORT = Dist()
