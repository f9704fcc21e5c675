"""An actor's way to the learner's weights, handed to its engine: the engine takes what it needs.

An engine either keeps a staging copy filled in the background (``subscriber``: the hf engine,
vLLM over ``dist`` or with LoRA adapters) or follows the announcements and has its own workers
read each version in place (``announcements``: vLLM over ``shm``). Which of the two it uses is the
engine's choice, made from the transport's capabilities (``transport``); the actor itself never
asks.

Where the actor's weights come from follows from the config and ``run.host_id`` alone: with
``weightsync.relay`` (``relay.relayed``) every actor reads its own host's shm segment, announced under
its host's keys (``hosts.host_keys``) by whoever serves that host: the learner on its own host, the
host's relay on any other. To the engine that is the ``shm`` transport.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import redis
import torch

from streamrl.broker.client import connect_sync
from streamrl.broker.keys import Keys
from streamrl.configs.schema import BrokerConfig, RunConfig, WeightSyncConfig
from streamrl.weightsync import transports
from streamrl.weightsync.announce import Announcement, read_announcement
from streamrl.weightsync.hosts import host_keys
from streamrl.weightsync.relay import relayed
from streamrl.weightsync.subscriber import Subscriber


class Announcements:
    """The newest announcement of one transport, read from Redis on each call."""

    def __init__(self, client: redis.Redis, keys: Keys, transport: str) -> None:
        """``client``: a sync Redis client, closed with this."""
        self.client = client
        self.keys = keys
        self.transport = transport

    def __call__(self) -> Announcement | None:
        ann = read_announcement(self.client, self.keys)
        return ann if ann is not None and ann.transport == self.transport else None

    def close(self) -> None:
        self.client.close()


@dataclass(frozen=True)
class WeightFeed:
    """The settings and the Redis of one actor's weights (``weightsync.*``)."""

    ws: WeightSyncConfig
    keys: Keys
    actor_id: str
    # a new sync client of the run's Redis
    connect: Callable[[], redis.Redis]

    @classmethod
    def from_config(
        cls, ws: WeightSyncConfig, broker: BrokerConfig, run: RunConfig, actor_id: str
    ) -> WeightFeed:
        keys = Keys.from_config(run, broker)
        # as relay.wanted(ws)
        if relayed(ws.transport, ws.relay):
            ws = ws.model_copy(update={"transport": "shm"})
            keys = host_keys(keys, run.host_id)
        return cls(ws, keys, actor_id, lambda: connect_sync(broker, run.dir))

    @property
    def transport(self) -> transports.Transport:
        return transports.get(self.ws.transport)

    def subscriber(self, template: dict[str, torch.Tensor]) -> Subscriber | None:
        """A subscriber staging each version as ``template`` (names, shapes, dtype and device of the
        engine's tensors), not yet started; None when the learner publishes nothing."""
        if not self.transport.publishes:
            return None
        return Subscriber(self.ws, self.keys, self.connect(), self.actor_id, template)

    def announcements(self) -> Announcements:
        return Announcements(self.connect(), self.keys, self.ws.transport)
