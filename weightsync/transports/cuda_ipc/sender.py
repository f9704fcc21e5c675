"""The learner's side of the ``cuda_ipc`` transport: each version copied (converting) into a free
slot on the learner's GPU, in ``Publisher.submit`` (the transport is not ``background``)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from streamrl.weightsync import metrics
from streamrl.weightsync.transports.cuda_ipc.slots import IpcSlotsWriter

if TYPE_CHECKING:
    import torch

    from streamrl.weightsync.layout import Layout
    from streamrl.weightsync.transports.cuda_ipc.device import DeviceIpc

log = logging.getLogger(__name__)


class CudaIpcSender:
    """Makes the slots on the device of the first version's tensors, then writes each version."""

    def __init__(
        self,
        ops: DeviceIpc,
        run_name: str,
        layout: Layout,
        slots: int,
        lease_s: float,
        host_id: str,
    ):
        self.ops = ops
        self.run_name = run_name
        self.layout = layout
        self.slots = slots
        self.lease_s = lease_s
        self.host_id = host_id
        self.writer: IpcSlotsWriter | None = None

    def send(
        self,
        version: int,
        tensors: dict[str, torch.Tensor],
        aliases: dict[str, str],
        checksums: dict[str, int] | None = None,
    ) -> dict:
        if self.writer is None:
            device = next(iter(tensors.values())).device
            self.writer = IpcSlotsWriter(
                self.ops, self.run_name, self.layout, self.slots, self.lease_s, device, self.host_id
            )
        slot, overrode = self.writer.write(version, tensors)
        if overrode:
            log.warning("cuda_ipc slot %d: a reader's lease ran out; writing over it", slot)
            metrics.TRANSFER_FAILURES.labels(reason="lease_timeout").inc()
        return {"segment": self.writer.name, "slot": slot}

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None
