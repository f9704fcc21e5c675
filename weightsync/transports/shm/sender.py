"""The learner's side of the shm transport: each version into a free slot of its segment."""

from __future__ import annotations

from typing import TYPE_CHECKING

from streamrl.weightsync import metrics

if TYPE_CHECKING:
    import torch

    from streamrl.weightsync.transports.shm.slots import ShmWriter


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
