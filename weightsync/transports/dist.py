"""The ``dist`` transport: torch.distributed broadcast in buckets (NCCL on GPUs, gloo on CPU); the
group, rendezvous and bucket code is ``weightsync.dist``.

Every member of the publisher's current group receives each version as it is broadcast; the
announcement only says which epoch and members took part. The members are the actors themselves,
or with ``weightsync.relay`` one relay per actor host (``weightsync.relay``); the learner then also
writes each version into a shm segment of its own host, for the actors there (``HostSender``).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from streamrl.weightsync.layout import Layout
from streamrl.weightsync.naming import NameMappingError
from streamrl.weightsync.transports.base import Staging, TransferTimeout, Transport

if TYPE_CHECKING:
    import redis
    import torch

    from streamrl.broker.keys import Keys
    from streamrl.configs.schema import WeightSyncConfig
    from streamrl.weightsync.dist import DistReceiver, DistSender
    from streamrl.weightsync.shm import ShmWriter

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
            # little for it rather than drop the version (the broadcast is under way anyway)
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


class HostSender:
    """With relays: each version goes to the group (one relay per actor host) and into this host's
    shm segment, announced under this host's keys, for the actors that run beside the learner."""

    def __init__(
        self,
        dist: DistSender,
        writer: ShmWriter,
        client: redis.Redis,
        local_keys: Keys,
        publisher: str,
    ):
        self.dist, self.writer, self.client = dist, writer, client
        self.local_keys, self.publisher = local_keys, publisher

    def send(
        self,
        version: int,
        tensors: dict[str, torch.Tensor],
        aliases: dict[str, str],
        checksums: dict[str, int] | None = None,
    ) -> dict:
        from streamrl.weightsync import metrics
        from streamrl.weightsync.announce import announce

        # the one copy: into this host's slot, which then is the broadcast's source (gloo's, on
        # the host; NCCL's buckets are on the GPU and are filled from the tensors)
        slot, overrode = self.writer.write(version, tensors, checksums)
        if overrode:
            metrics.TRANSFER_FAILURES.labels(reason="lease_timeout").inc()
        layout = self.dist.layout
        local = {"layout": layout.to_json(), "aliases": aliases}
        local |= {"segment": self.writer.name, "slot": slot}
        announce(self.client, self.local_keys, version, "shm", self.publisher, local)
        flat = self.writer.flat(slot) if self.dist.device.type == "cpu" else None
        sums = self.writer.checksums(slot)
        return self.dist.send(version, tensors, aliases, checksums, flat=flat, sums=sums)

    def close(self) -> None:
        self.dist.close()
        self.writer.close()


class Dist(Transport):
    name = "dist"
    process_group = True
    relays = True

    def sender(
        self,
        ws: WeightSyncConfig,
        client: redis.Redis,
        keys: Keys,
        layout: Layout,
        *,
        publisher: str = "",
        host_id: str = "",
    ) -> DistSender | HostSender:
        from streamrl.weightsync.address import routable
        from streamrl.weightsync.dist import DistSender

        broker_host = client.connection_pool.connection_kwargs.get("host")
        dist = DistSender(
            client,
            keys,
            layout,
            bucket_bytes=ws.bucket_bytes,
            timeout_s=ws.timeout_s,
            backend=ws.backend,
            host=ws.dist_host or routable(broker_host),
            port=ws.dist_port,
            ports=ws.dist_ports,
            host_id=host_id,
            publisher=publisher,
        )
        if not ws.relay:
            return dist
        from streamrl.weightsync.hosts import host_keys
        from streamrl.weightsync.shm import ShmWriter

        writer = ShmWriter(keys.run_name, layout, ws.slots, ws.timeout_s, host_id)
        return HostSender(dist, writer, client, host_keys(keys, host_id), publisher)

    def receiver(
        self, ws: WeightSyncConfig, client: redis.Redis, keys: Keys, actor_id: str
    ) -> DistTransportReceiver:
        from streamrl.weightsync.dist import DistReceiver

        return DistTransportReceiver(
            DistReceiver(client, keys, actor_id, timeout_s=ws.timeout_s), ws.timeout_s
        )


TRANSPORT = Dist()
