"""An actor's side of the shm transport: the announced slot copied into the staging copy under a
lease (the loop is ``transports.slot_receiver``'s)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from streamrl.weightsync.transports.shm.slots import ShmReader
from streamrl.weightsync.transports.slot_receiver import SlotReceiver

if TYPE_CHECKING:
    from streamrl.weightsync.layout import Layout
    from streamrl.weightsync.transports.base import Fill


class ShmReceiver(SlotReceiver):
    def open(self, segment: str) -> ShmReader:
        return ShmReader(segment, self.timeout_s, run_name=self.run_name)

    def read(self, version: int, slot: int, layout: Layout, fill: Fill) -> str:
        return self.reader.read_into(version, slot, layout, fill.pairs, fill.tensors)
