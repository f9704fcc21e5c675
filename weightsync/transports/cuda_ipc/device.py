"""Every CUDA call of the ``cuda_ipc`` transport, behind one small interface (``DeviceIpc``).

The transport's protocol (``slots``, ``sender``, ``receiver``) calls only these five things, so
it runs unchanged against a stand-in that shares CPU tensors between processes (tests/), and the
lines that need a GPU are the few here.

Handles are torch's own CUDA IPC mechanism (what ``torch.multiprocessing`` sends for a CUDA
tensor: ``UntypedStorage._share_cuda_`` and ``reductions.rebuild_cuda_tensor``), turned into
plain fields (ints, bytes, a string) so they travel in a shared-memory segment as msgpack and
are never unpickled.

A slot is opened on the local ordinal of the GPU it lives on, found by the device's UUID (the
learner's ``cuda:0`` may be this process's ``cuda:1``, or hidden by ``CUDA_VISIBLE_DEVICES``,
which makes the handle unopenable: ``DeviceNotVisible``). An actor whose own device is another
GPU copies from that view into its device: torch's ``copy_`` between two devices is a peer copy
(``cudaMemcpyPeerAsync``: direct over NVLink/PCIe where peer access is possible, else staged
through the host by the driver), ordered against both devices' current streams.
"""

from __future__ import annotations

from typing import Protocol

import torch

from streamrl.configs.errors import StreamRLError


class DeviceNotVisible(StreamRLError, RuntimeError):
    """The GPU a handle belongs to is not one this process sees."""


class Fence(Protocol):
    def synchronize(self) -> None:
        """Return once the work queued before the fence was recorded is done."""
        ...


class DeviceIpc(Protocol):
    def allocate(self, nbytes: int, device: torch.device) -> torch.Tensor:
        """A flat uint8 buffer on ``device`` that ``share`` can export."""
        ...

    def share(self, buffer: torch.Tensor) -> dict:
        """Plain fields (str, int, bytes, bool, None) from which another process on this host
        opens ``buffer`` (``open``)."""
        ...

    def open(self, fields: dict) -> torch.Tensor:
        """The buffer ``share`` described, as a flat uint8 tensor of this process (same memory)."""
        ...

    def fence(self, device: torch.device) -> Fence:
        """A fence after the work queued so far on ``device``'s current stream."""
        ...

    def device_id(self, device: torch.device) -> str:
        """What names ``device`` alike in every process of this host."""
        ...


# every field ``CudaIpc.share`` writes, with its type: what ``open`` accepts
FIELDS = {
    "uuid": str,
    "handle": bytes,
    "storage_bytes": int,
    "storage_offset": int,
    "ref_handle": bytes,
    "ref_offset": int,
    "event_handle": (bytes, type(None)),
    "event_sync": bool,
    "offset": int,
    "numel": int,
}


class CudaIpc:
    """``DeviceIpc`` on CUDA."""

    def allocate(self, nbytes: int, device: torch.device) -> torch.Tensor:
        if device.type != "cuda":
            raise ValueError(
                f"weightsync.transport=cuda_ipc shares the learner's weights from its GPU; they are on {device}"
            )
        return torch.empty(nbytes, dtype=torch.uint8, device=device)

    def share(self, buffer: torch.Tensor) -> dict:
        (_, handle, size, offset, ref_handle, ref_offset, event_handle, event_sync) = (
            buffer.untyped_storage()._share_cuda_()
        )
        return {
            "uuid": self.device_id(buffer.device),
            "handle": bytes(handle),
            "storage_bytes": int(size),
            "storage_offset": int(offset),
            "ref_handle": bytes(ref_handle),
            "ref_offset": int(ref_offset),
            "event_handle": None if event_handle is None else bytes(event_handle),
            "event_sync": bool(event_sync),
            "offset": buffer.storage_offset(),
            "numel": buffer.numel(),
        }

    def open(self, fields: dict) -> torch.Tensor:
        from torch.multiprocessing.reductions import rebuild_cuda_tensor

        ordinal = self._ordinal(fields["uuid"])
        return rebuild_cuda_tensor(
            torch.Tensor,
            (fields["numel"],),
            (1,),
            fields["offset"],
            torch.UntypedStorage,
            torch.uint8,
            ordinal,
            fields["handle"],
            fields["storage_bytes"],
            fields["storage_offset"],
            False,
            fields["ref_handle"],
            fields["ref_offset"],
            fields["event_handle"],
            fields["event_sync"],
        )

    def fence(self, device: torch.device) -> Fence:
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(device))
        return event

    def device_id(self, device: torch.device) -> str:
        return str(torch.cuda.get_device_properties(device).uuid)

    def _ordinal(self, uuid: str) -> int:
        for ordinal in range(torch.cuda.device_count()):
            if self.device_id(torch.device("cuda", ordinal)) == uuid:
                return ordinal
        raise DeviceNotVisible(
            f"GPU {uuid} holds the learner's weight slots but is not visible here "
            "(CUDA_VISIBLE_DEVICES): cuda_ipc needs the actor to see the learner's GPU"
        )
