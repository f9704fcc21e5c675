"""The ``none`` transport: the learner publishes nothing and actors keep the weights they loaded
(runs that measure the system without weight traffic, and learner tests)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from streamrl.weightsync.transports.base import Staging, Transport

if TYPE_CHECKING:
    import redis
    import torch

    from streamrl.broker.keys import Keys
    from streamrl.configs.weightsync import WeightSyncConfig
    from streamrl.weightsync.layout import Layout

# a receiver has nothing to wait for: look again this rarely
IDLE_WAIT_S = 1.0


class NoSender:
    def send(
        self,
        version: int,
        tensors: dict[str, torch.Tensor],
        aliases: dict[str, str],
        checksums: dict[str, int] | None = None,
    ) -> dict:
        return {}

    def close(self) -> None:
        pass


class NoReceiver:
    def step(self, staging: Staging) -> float:
        return IDLE_WAIT_S

    def close(self) -> None:
        pass


class NoTransport(Transport):
    name = "none"
    publishes = False
    shared_memory = False
    device_ipc = False
    background = False
    process_group = False
    relays = False

    def sender(
        self,
        ws: WeightSyncConfig,
        client: redis.Redis,
        keys: Keys,
        layout: Layout,
        *,
        publisher: str = "",
        host_id: str = "",
    ) -> NoSender:
        return NoSender()

    def receiver(
        self, ws: WeightSyncConfig, client: redis.Redis, keys: Keys, actor_id: str
    ) -> NoReceiver:
        return NoReceiver()


TRANSPORT = NoTransport()
