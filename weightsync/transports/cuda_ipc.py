"""The ``cuda_ipc`` transport: GPU actors on the learner's host copy each version device to device
from the learner's GPU (the slots and their control segment are ``weightsync.ipc_slots``, every
CUDA call ``weightsync.device_ipc``).

Not ``background``: the publisher's background path stages each version through pinned host
memory for a thread to write out, which is the copy this transport exists to avoid. Here the
slot on the learner's GPU is the staging buffer: ``send`` runs in ``Publisher.submit``, copies
(converting) the learner's tensors into a free slot on the GPU and waits for that copy and its
checksums (a device-to-device copy: milliseconds), so the learner may change its weights as soon
as ``submit`` returns, and the announcement follows at once.

A receiver copies the announced slot into the subscriber's staging tensors on the actor's device
(the hf engine swaps them in as over shm); vLLM's workers open the slots themselves and load from
them in place (``weightsync.vllm_ipc_engine``).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch

from streamrl.weightsync import metrics
from streamrl.weightsync.device_ipc import CudaIpc, DeviceIpc
from streamrl.weightsync.transports.base import Staging, Transport
from streamrl.weightsync.transports.shm import ShmReceiver

if TYPE_CHECKING:
    import redis

    from streamrl.broker.keys import Keys
    from streamrl.configs.schema import WeightSyncConfig
    from streamrl.weightsync.ipc_slots import IpcSlotsWriter
    from streamrl.weightsync.layout import Layout

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
            from streamrl.weightsync.ipc_slots import IpcSlotsWriter

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


class CudaIpcReceiver(ShmReceiver):
    """The shm receiver's loop (leases, stale and torn reads retried) over the learner's GPU
    slots, into a staging copy that is one buffer in the slot's layout where it can be: a version
    is then one device-to-device copy and one checksum pass (``IpcSlotsReader.read_into``)."""

    FLAT = True

    def __init__(self, ops: DeviceIpc, timeout_s: float):
        super().__init__(timeout_s)
        self.ops = ops

    def _read(self, staging: Staging, version: int, slot: int, layout, dest: dict) -> str:
        return self.reader.read_into(version, slot, layout, staging.pairs, dest, staging.flat)

    def _open(self, staging: Staging, ann) -> bool:
        """Open the announced control segment and its slots (once per publisher); False, with the
        version skipped and the reason counted, when they cannot be opened."""
        from streamrl.weightsync.ipc_slots import IpcSlotsReader

        segment = ann.meta["segment"]
        if self.reader is not None and self.reader.name == segment:
            return True
        self.close()
        try:
            self.reader = IpcSlotsReader(self.ops, segment, self.timeout_s)
        except FileNotFoundError:
            staging.skip(ann)
            staging.fail(
                "segment_gone",
                f"{segment} is gone (publisher exited); keeping version {staging.version}",
            )
            return False
        except (OSError, ValueError, RuntimeError) as exc:
            # a GPU this process does not see, a driver refusing the handle, a segment not ours
            staging.skip(ann)
            staging.fail(
                "ipc_open",
                f"cannot open the learner's weight slots in {segment} ({exc}); keeping version {staging.version}",
            )
            return False
        return True


class CudaIpcTransport(Transport):
    name = "cuda_ipc"
    device_ipc = True

    def __init__(self, ops: DeviceIpc):
        self.ops = ops

    def sender(
        self,
        ws: WeightSyncConfig,
        client: redis.Redis,
        keys: Keys,
        layout: Layout,
        *,
        publisher: str = "",
        host_id: str = "",
    ) -> CudaIpcSender:
        return CudaIpcSender(self.ops, keys.run_name, layout, ws.slots, ws.timeout_s, host_id)

    def receiver(
        self, ws: WeightSyncConfig, client: redis.Redis, keys: Keys, actor_id: str
    ) -> CudaIpcReceiver:
        return CudaIpcReceiver(self.ops, ws.timeout_s)

    def describe(self, meta: dict) -> dict:
        """The readers copying a slot right now (their leases in the control segment)."""
        from streamrl.weightsync.shm import active_leases

        try:
            return {"readers_copying": active_leases(meta["segment"])}
        except FileNotFoundError:
            return {"readers_copying": "segment gone (publisher exited)"}


TRANSPORT = CudaIpcTransport(CudaIpc())
