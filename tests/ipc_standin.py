"""A stand-in for ``weightsync.device_ipc.CudaIpc`` on CPU, and an actor process that uses it.

``FileIpc`` "allocates device memory" as a file-backed CPU tensor and "shares" it by the file's
path, so two unrelated processes see the same bytes as two processes see one GPU buffer through
CUDA IPC handles: the cuda_ipc protocol (control segment, stamps, leases, fence, checksums) runs
unchanged on CPU. ``python tests/ipc_standin.py actor ...`` is an actor process taking versions
over it and printing one JSON line per version it applied.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
import time
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
        from streamrl.weightsync.device_ipc import DeviceNotVisible

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


def actor(args) -> None:
    """Apply every version the subscriber stages; one JSON line each, until stdin closes."""
    import threading

    from weightsync_procs import check, engine_template

    from streamrl.broker.client import connect_sync
    from streamrl.broker.keys import Keys
    from streamrl.configs.schema import BrokerConfig, RunConfig, WeightSyncConfig
    from streamrl.weightsync.subscriber import Subscriber
    from streamrl.weightsync.transports import cuda_ipc

    cuda_ipc.TRANSPORT.ops = FileIpc(args.dir)
    ws = WeightSyncConfig(transport="cuda_ipc", timeout_s=5.0)
    broker, run = BrokerConfig(redis_url=args.redis), RunConfig(name=args.run, dir=args.run_dir)
    template = engine_template(args.hidden, args.layers)
    sub = Subscriber(
        ws, Keys.from_config(run, broker), connect_sync(broker, run.dir), "a0", template
    ).start()
    done = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
    print(json.dumps({"event": "started"}), flush=True)
    while not done.is_set():
        staged = sub.take_staged()
        if staged is None:
            time.sleep(0.002)
            continue
        version, tensors = staged
        ok = check(version, tensors, args.hidden, args.layers)
        sub.applied(version)
        print(json.dumps({"event": "applied", "version": version, "ok": ok}), flush=True)
    sub.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("role", choices=["actor"])
    for name in ("--redis", "--run", "--run-dir", "--dir"):
        parser.add_argument(name, required=True)
    parser.add_argument("--hidden", type=int, default=16)
    parser.add_argument("--layers", type=int, default=2)
    actor(parser.parse_args())
