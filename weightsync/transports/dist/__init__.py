"""The ``dist`` transport: torch.distributed broadcast in buckets (NCCL on GPUs, gloo on CPU).

Every member of the publisher's current group receives each version as it is broadcast; the
announcement only says which epoch and members took part. The members are the actors themselves,
or with ``weightsync.relay`` one relay per actor host (``weightsync.relay``); the learner then also
writes each version into a shm segment of its own host, for the actors there
(``sender.HostSender``).

The publisher broadcasts the flat weight layout in fixed-size buckets (``buckets``) to the members
of a process group of its own (``group``), separate from the learner's DeepSpeed world: it is
built directly from one ``TCPStore`` the publisher hosts for its lifetime on the first free port of
``weightsync.dist_port``..``+dist_ports-1`` (a range a firewall can allow) and at the address
other hosts reach it on (``address``), so members can join and leave between versions, each
membership an "epoch" under its own key prefix.

Rendezvous through Redis (``sender.DistSender``, ``receiver.DistReceiver``):
- members heartbeat ``{weights}:dist:members`` (hash: member id -> "expiry seen-epoch", the newest
  group record the member has acted on);
- before a publish, if the membership changed (or the last broadcast failed), the publisher writes
  ``{weights}:dist:group`` (epoch, host, port, backend, invited members, its host id) and notifies;
  each invited member checks in (``e{epoch}/ready/{member}``). After all checked in, or
  ``timeout_s`` after the record, the publisher writes ``e{epoch}/final`` (the members that made it,
  in rank order) and builds the group with those alone, so a slow or dead member costs one publish
  at most ``timeout_s`` and never a retry loop. A dropped member is invited again only once its
  heartbeat says it has seen the epoch it was dropped from: a dead or partitioned one is not waited
  for twice, and one that comes back (or restarts, or starts late) joins at the next publish;
- each publish puts ``pub/{seq}`` (version, layout, aliases, publisher id) into the store, then
  broadcasts the buckets. Every collective waits at most ``timeout_s``; a failure marks the group
  broken, and the next publish re-forms it.

Imports nothing heavy: the modules above are imported where a sender or receiver is made.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from streamrl.weightsync.transports.base import Transport

if TYPE_CHECKING:
    import redis

    from streamrl.broker.keys import Keys
    from streamrl.configs.weightsync import WeightSyncConfig
    from streamrl.weightsync.layout import Layout
    from streamrl.weightsync.transports.dist.receiver import DistTransportReceiver
    from streamrl.weightsync.transports.dist.sender import DistSender, HostSender


class Dist(Transport):
    name = "dist"
    publishes = True
    shared_memory = False
    device_ipc = False
    background = False
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
        from streamrl.weightsync.transports.dist.address import routable
        from streamrl.weightsync.transports.dist.sender import DistSender

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
        from streamrl.weightsync.transports.dist.sender import HostSender
        from streamrl.weightsync.transports.shm.sender import ShmSender
        from streamrl.weightsync.transports.shm.slots import ShmWriter

        shm = ShmSender(ShmWriter(keys.run_name, layout, ws.slots, ws.timeout_s, host_id))
        return HostSender(dist, shm, client, host_keys(keys, host_id), publisher)

    def receiver(
        self, ws: WeightSyncConfig, client: redis.Redis, keys: Keys, actor_id: str
    ) -> DistTransportReceiver:
        from streamrl.weightsync.transports.dist.receiver import (
            DistReceiver,
            DistTransportReceiver,
        )

        return DistTransportReceiver(
            DistReceiver(client, keys, actor_id, timeout_s=ws.timeout_s), ws.timeout_s
        )


TRANSPORT = Dist()
