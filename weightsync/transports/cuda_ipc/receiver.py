"""An actor's side of the ``cuda_ipc`` transport: the announced slot on the learner's GPU copied
device to device into a staging copy that is one buffer in the slot's layout where it can be: a
version is then one copy and one checksum pass (``IpcSlotsReader.read_into``). The loop (leases,
stale and torn reads retried) is ``transports.slot_receiver``'s."""

from __future__ import annotations

from typing import TYPE_CHECKING

from streamrl.weightsync.transports.cuda_ipc.slots import IpcSlotsReader
from streamrl.weightsync.transports.shm.segment import SegmentNameError
from streamrl.weightsync.transports.slot_receiver import CannotOpen, SlotReceiver

if TYPE_CHECKING:
    from streamrl.weightsync.layout import Layout
    from streamrl.weightsync.transports.base import Fill
    from streamrl.weightsync.transports.cuda_ipc.device import DeviceIpc


class CudaIpcReceiver(SlotReceiver):
    flat = True

    def __init__(self, ops: DeviceIpc, timeout_s: float, run_name: str | None = None):
        super().__init__(timeout_s, run_name)
        self.ops = ops

    def open(self, segment: str) -> IpcSlotsReader:
        """The control segment and its slots (their handles opened once per publisher)."""
        try:
            return IpcSlotsReader(self.ops, segment, self.timeout_s, run_name=self.run_name)
        except (FileNotFoundError, SegmentNameError):
            raise
        except (OSError, ValueError, RuntimeError) as exc:
            # a GPU this process does not see, a driver refusing the handle, a segment not ours
            raise CannotOpen(
                "ipc_open", f"cannot open the learner's weight slots in {segment} ({exc})"
            ) from exc

    def read(self, version: int, slot: int, layout: Layout, fill: Fill) -> str:
        return self.reader.read_into(version, slot, layout, fill.pairs, fill.tensors, fill.flat)
