"""The ``dist`` transport: torch.distributed broadcast in buckets (NCCL on GPUs, gloo on CPU).

Every member of the publisher's current group receives each version as it is broadcast; the
announcement only says which epoch and members took part. The members are the actors themselves,
or with ``weightsync.dist.relay`` one relay per actor host (``weightsync.relay``); the learner then also
writes each version into a shm segment of its own host, for the actors there
(``sender.HostSender``).

The publisher broadcasts the flat weight layout in fixed-size buckets (``buckets``) to the members
of a process group of its own (``group``), separate from the learner's DeepSpeed world: it is
built directly from one ``TCPStore`` the publisher hosts for its lifetime on the first free port of
``weightsync.dist.port``..``+ports-1`` (a range a firewall can allow) and at the address
other hosts reach it on (``address``), so members can join and leave between versions, each
membership an "epoch" under its own key prefix.

Rendezvous through Redis (``sender.DistSender``, ``receiver.DistReceiver``):
- members heartbeat ``{weights}:dist:members`` (hash: member id -> "expiry seen joined": the newest
  group record the member has acted on, and the epoch whose group it is in, -1 for none); an entry
  that does not parse, or is not finite, is dropped and counted (``trust.beat``);
- before a publish, if the membership changed (or the last broadcast failed), the publisher writes
  ``{weights}:dist:group`` (epoch, host, port, backend, invited members, its host id) and notifies;
  each invited member checks in (``e{epoch}/ready/{member}``). After all checked in, or
  ``timeout_s`` after the record, the publisher writes ``e{epoch}/final`` (the members that made it,
  in rank order) and builds the group with those alone, so a slow or dead member costs one publish
  at most ``timeout_s`` and never a retry loop. A dropped member is invited again only once its
  heartbeat says it has seen the epoch it was dropped from: a dead or partitioned one is not waited
  for twice, and one that comes back (or restarts, or starts late) joins at the next publish;
- each publish puts ``pub/{seq}`` (version, layout, aliases, bucket size, publisher id, checksums)
  into the store, then broadcasts the buckets; with relays, from the learner's host slot in
  pieces, each broadcast while the next is written into the slot (``sender.HostSender``), and
  the checksums, taken as the slot is written, follow in ``pub/{seq}/sums`` (the same header
  with them). ``final`` and every ``pub/{seq}`` (and ``/sums``) are signed with
  the epoch's secret from Redis, and members act on nothing else (``trust``): the store answers
  anyone who reaches its port. Every collective waits at most ``timeout_s``; a failure marks the group
  broken, and the next publish re-forms it.

Imports nothing heavy: the modules above are imported where a sender or receiver is made.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field

from streamrl.configs.section import Section
from streamrl.weightsync.transports.base import Transport

if TYPE_CHECKING:
    import redis

    from streamrl.broker.keys import Keys
    from streamrl.configs.weightsync import WeightSyncConfig
    from streamrl.weightsync.layout import Layout
    from streamrl.weightsync.transports.dist.receiver import DistTransportReceiver
    from streamrl.weightsync.transports.dist.sender import DistSender, HostSender
    from streamrl.weightsync.transports.shm.slots import ShmWriter


class Options(Section):
    """The ``dist`` transport's group, rendezvous and buckets (``weightsync.dist``)."""

    host: str | None = Field(
        None,
        description="The learner host's address that actors (or relays) reach its rendezvous store and group on; gloo binds it too. None = the address its traffic to the broker leaves from: loopback while the broker is on loopback (the run stays on this host), else routable (if the broker's name resolves to this host's loopback: the default route's address, else any interface's that is up).",
    )
    port: int = Field(
        29600,
        ge=0,
        le=65535,
        description="First TCP port of the learner's rendezvous store (the first free one of `port`..`port + ports - 1` is taken; 0 = any free port). A firewall must let actor hosts reach this range on the learner host, and let the process group's own connections through both ways: gloo and NCCL open them on ephemeral ports, which neither lets you pin (docs/multihost.md).",
    )
    ports: int = Field(
        8,
        ge=1,
        le=1024,
        description="How many ports from `port` on the store may take (runs or learners sharing a host take one each).",
    )
    backend: Literal["auto", "nccl", "gloo"] = Field(
        "auto", description="Process-group backend (auto = nccl with CUDA, else gloo)."
    )
    bucket_bytes: int = Field(64 << 20, ge=1 << 16, description="Broadcast bucket size.")
    relay: bool = Field(
        False,
        description="One relay per actor host (`python -m streamrl.weightsync.relay`, started by `streamrl actors`) joins the learner's group and hands each version to its host's actors over shm, so one copy per host crosses the network; the learner's own host's actors read the learner's shm. False = every actor joins the group itself (NCCL straight into its GPU).",
    )
    relay_slots: int = Field(
        3,
        ge=2,
        description="With relay: the ring of slots in each host's shm segment (written by its relay, or on the learner's host by the learner), so a version is never written over a slot an actor is copying.",
    )


class Dist(Transport):
    name = "dist"
    summary = "torch.distributed broadcast (NCCL/gloo), across hosts"
    options = Options
    publishes = True
    shared_memory = False
    device_ipc = False
    background = False

    def relayed(self, ws: WeightSyncConfig) -> bool:
        return ws.dist.relay

    def group_backend(self, ws: WeightSyncConfig) -> str | None:
        return ws.dist.backend

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
            bucket_bytes=ws.dist.bucket_bytes,
            timeout_s=ws.timeout_s,
            backend=ws.dist.backend,
            host=ws.dist.host or routable(broker_host),
            port=ws.dist.port,
            ports=ws.dist.ports,
            host_id=host_id,
            publisher=publisher,
        )
        if not ws.dist.relay:
            return dist
        from streamrl.weightsync.hosts import host_keys
        from streamrl.weightsync.transports.dist.sender import HostSender
        from streamrl.weightsync.transports.shm.sender import ShmSender

        shm = ShmSender(host_segment(ws, keys, layout, host_id))
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


def host_segment(ws: WeightSyncConfig, keys: Keys, layout: Layout, host_id: str) -> ShmWriter:
    """The shm ring (``relay_slots``) that ``host_id``'s actors read under ``relay``: written by
    the host's relay, or on the learner's host by the learner."""
    from streamrl.weightsync.transports.shm.slots import ShmWriter

    return ShmWriter(keys.run_name, layout, ws.dist.relay_slots, ws.timeout_s, host_id)
