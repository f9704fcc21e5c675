"""The learner's side of the shm transport: each version into a free slot of its segment."""

from __future__ import annotations

from typing import TYPE_CHECKING

from streamrl.weightsync import metrics
from streamrl.weightsync.transports.shm.slots import ShmWriter, SlotFill

if TYPE_CHECKING:
    import torch


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
        fill = self.fill(version, tensors, checksums)
        fill.commit()
        return {"segment": self.writer.name, "slot": fill.slot}

    def fill(
        self,
        version: int,
        tensors: dict[str, torch.Tensor],
        checksums: dict[str, int] | None = None,
    ) -> SlotFill:
        """A free slot to write ``version`` into piece by piece (``SlotFill``)."""
        fill = SlotFill(self.writer, version, tensors, checksums)
        if fill.overrode:
            metrics.TRANSFER_FAILURES.labels(reason="lease_timeout").inc()
        return fill

    def close(self) -> None:
        self.writer.close()
