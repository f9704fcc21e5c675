"""A stand-in for ``weightsync.transports.cuda_ipc.device.CudaIpc`` on CPU, and an actor process that uses it.

``FileIpc`` "allocates device memory" as a file-backed CPU tensor and "shares" it by the file's
path, so two unrelated processes see the same bytes as two processes see one GPU buffer through
CUDA IPC handles: the cuda_ipc protocol (control segment, stamps, leases, fence, checksums) runs
unchanged on CPU. ``python tests/ipc_standin.py --dir D subscriber ...`` is
``tests/weightsync_procs.py``'s subscriber process taking versions over it.
"""

from __future__ import annotations

import argparse
import os
import secrets
import sys
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


class Fence:
    def __init__(self, on_wait):
        self.on_wait = on_wait

    def synchronize(self) -> None:
        if self.on_wait is not None:
            self.on_wait()


class FileIpc:
    """``DeviceIpc`` over files in ``directory``; ``uuid`` names the "GPU" this process sees."""

    def __init__(self, directory: str | Path, uuid: str = "standin-gpu-0"):
        self.directory = Path(directory)
        self.uuid = uuid
        self.paths: dict[int, str] = {}
        # called when the sender waits on a fence (a test looks at the slot's stamps there)
        self.on_fence = None
        self.fences = 0

    def allocate(self, nbytes: int, device: torch.device) -> torch.Tensor:
        path = str(self.directory / f"slot-{secrets.token_hex(8)}")
        buffer = torch.from_file(path, shared=True, size=nbytes, dtype=torch.uint8)
        self.paths[buffer.data_ptr()] = path
        return buffer

    def share(self, buffer: torch.Tensor) -> dict:
        return {
            "uuid": self.uuid,
            "handle": self.paths[buffer.data_ptr()].encode(),
            "storage_bytes": buffer.numel(),
            "storage_offset": 0,
            "ref_handle": b"",
            "ref_offset": 0,
            "event_handle": None,
            "event_sync": False,
            "offset": 0,
            "numel": buffer.numel(),
        }

    def open(self, fields: dict) -> torch.Tensor:
        from streamrl.weightsync.transports.cuda_ipc.device import DeviceNotVisible

        if fields["uuid"] != self.uuid:
            raise DeviceNotVisible(f"GPU {fields['uuid']} is not visible here")
        path = fields["handle"].decode()
        if not os.path.exists(path):
            raise RuntimeError(f"invalid device pointer ({path} is gone)")
        return torch.from_file(path, shared=True, size=fields["numel"], dtype=torch.uint8)

    def fence(self, device: torch.device) -> Fence:
        self.fences += 1
        return Fence(self.on_fence)

    def device_id(self, device: torch.device) -> str:
        return self.uuid


if __name__ == "__main__":
    # ipc_standin.py --dir D <weightsync_procs.py's arguments>: that process, its cuda_ipc calls
    # answered by the stand-in over the files in D
    from weightsync_procs import main

    from streamrl.weightsync.transports import cuda_ipc

    parser = argparse.ArgumentParser()
    parser.add_argument("--dir", required=True)
    args, rest = parser.parse_known_args()
    cuda_ipc.TRANSPORT.ops = FileIpc(args.dir)
    main(rest)
