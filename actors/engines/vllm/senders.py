"""The trainer side of vLLM's ``ipc`` and ``nccl`` weight-transfer backends: a staged set cut into
buckets (``plan_buckets``), and how one bucket reaches the engine's workers (``BucketSender``).

- ``ipc`` (CUDA IPC, staged tensors and the engine on one GPU): no init; the
  update info carries ``names``, ``dtype_names``, ``shapes`` and
  ``ipc_handles_pickled`` (base64 pickle of ``[{gpu uuid: reduce_tensor(t)[1]}]``,
  the rebuild args alone, as vLLM's own trainer sends them), which the workers
  unpickle only with ``VLLM_ALLOW_INSECURE_SERIALIZATION=1``.
- ``nccl`` (staged tensors on a GPU the engine does not use): init info
  ``nccl_unique_id_b64``, ``rank_offset=1``, ``world_size`` = 1 + the engine's
  workers; this process mints the NCCL unique id, joins as rank 0 through
  ``nccl_common.uid_init_process_group`` and broadcasts each tensor of a bucket
  (in update-info order, unpacked) while ``update_weights`` receives it. Not
  vLLM's TCP rendezvous (``master_address``/``master_port``): its workers
  unpickle what that store holds, and the port was picked, announced and bound
  only later, so any process on the host could take it first and feed them a
  pickle. The unique id never leaves this process and its engine (the init
  request goes over vLLM's own channel to its workers); NCCL binds its bootstrap
  socket before the id exists and accepts a peer only with the id's random
  magic, and nothing on that path is unpickled.

Only the senders' methods touch vLLM or CUDA (imported lazily).
"""

from __future__ import annotations

import base64
import pickle
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from streamrl.weightsync.layout import TensorSpec


@dataclass(frozen=True)
class Bucket:
    specs: tuple[TensorSpec, ...]

    @property
    def nbytes(self) -> int:
        return sum(s.nbytes for s in self.specs)

    def update_info(self) -> dict:
        """The per-bucket metadata every backend's update info starts from."""
        return {
            "names": [s.name for s in self.specs],
            "dtype_names": [s.dtype for s in self.specs],
            "shapes": [list(s.shape) for s in self.specs],
        }

    def tensors(self, staged: Mapping[str, torch.Tensor]) -> list[torch.Tensor]:
        """This bucket's tensors out of a staged set, in update-info order."""
        return [staged[s.name] for s in self.specs]


def plan_buckets(specs: Sequence[TensorSpec], bucket_bytes: int) -> list[Bucket]:
    """Greedy, order-preserving buckets of at most ``bucket_bytes``; a larger tensor gets a bucket alone."""
    if bucket_bytes <= 0:
        raise ValueError("bucket_bytes must be positive")
    buckets: list[Bucket] = []
    current: list[TensorSpec] = []
    size = 0
    for spec in specs:
        if current and size + spec.nbytes > bucket_bytes:
            buckets.append(Bucket(tuple(current)))
            current, size = [], 0
        current.append(spec)
        size += spec.nbytes
    if current:
        buckets.append(Bucket(tuple(current)))
    return buckets


def staged_buckets(staged: Mapping[str, torch.Tensor], bucket_bytes: int) -> list[Bucket]:
    """Buckets over a staged set (its names, shapes and dtypes, in its order)."""
    return plan_buckets([TensorSpec.of(name, t) for name, t in staged.items()], bucket_bytes)


class BucketSender(Protocol):
    """The trainer side of one vLLM weight-transfer backend, for buckets of staged tensors."""

    def init_info(self) -> dict | None:
        """``init_weight_transfer_engine``'s init info; None = the backend needs no init."""

    def connect(self) -> None:
        """This side of the init handshake; runs in a thread while the engine's init runs."""

    def update_info(self, bucket: Bucket, tensors: Sequence[torch.Tensor]) -> dict:
        """``update_weights``' update info for this bucket."""

    def send(self, bucket: Bucket, tensors: Sequence[torch.Tensor]) -> None:
        """The bucket's data plane; runs in a thread while the engine's ``update_weights`` receives."""

    def close(self) -> None: ...


class IPCSender:
    """CUDA IPC: the update info itself carries handles to the staged tensors (same GPU as the engine)."""

    def init_info(self) -> None:
        # "The IPC backend requires no initialization on either side."
        return None

    def connect(self) -> None:
        pass

    def __init__(self, device_uuid: Callable[[torch.device], str] | None = None) -> None:
        self.device_uuid = device_uuid or _cuda_uuid
        self._alive: list[torch.Tensor] = []

    def update_info(self, bucket: Bucket, tensors: Sequence[torch.Tensor]) -> dict:
        from torch.multiprocessing.reductions import reduce_tensor

        uuids: dict[torch.device, str] = {}
        handles = []
        # the handles do not keep their storage alive: hold every tensor until the next push
        self._alive = [tensor.detach().contiguous() for tensor in tensors]
        for tensor in self._alive:
            if tensor.device not in uuids:
                uuids[tensor.device] = self.device_uuid(tensor.device)
            # vLLM's worker rebuilds from the args alone (its own trainer sends reduce_tensor(w)[1])
            handles.append({uuids[tensor.device]: reduce_tensor(tensor)[1]})
        info = bucket.update_info()
        info["ipc_handles_pickled"] = base64.b64encode(pickle.dumps(handles)).decode("ascii")
        return info

    def send(self, bucket: Bucket, tensors: Sequence[torch.Tensor]) -> None:
        # the workers read the staged tensors through the handles
        pass

    def close(self) -> None:
        self._alive = []


def _cuda_uuid(device: torch.device) -> str:
    return str(torch.cuda.get_device_properties(device).uuid)


def mint_nccl_unique_id() -> bytes:
    """A fresh ``ncclGetUniqueId`` (128 bytes: NCCL's bootstrap address, already listening, and a
    random magic), through vLLM's NCCL binding."""
    from vllm.distributed.device_communicators.pynccl_wrapper import NCCLLibrary

    return bytes(NCCLLibrary().ncclGetUniqueId().internal)


class NCCLSender:
    """NCCL: this process is rank 0 of a group with the engine's workers and broadcasts each
    tensor; the group meets through an NCCL unique id (module docstring, ``nccl``)."""

    def __init__(
        self,
        world_size: int,
        device: str | torch.device,
        mint: Callable[[], bytes] = mint_nccl_unique_id,
    ) -> None:
        self.world_size = world_size
        self.device = torch.device(device)
        self.mint = mint
        self.unique_id: bytes | None = None
        self.group = None

    def init_info(self) -> dict:
        # a new id per handshake: NCCL's bootstrap root serves one group
        self.unique_id = self.mint()
        return {
            "nccl_unique_id_b64": base64.b64encode(self.unique_id).decode("ascii"),
            # the workers follow this process, rank 0
            "rank_offset": 1,
            "world_size": self.world_size,
        }

    def connect(self) -> None:
        # vLLM 0.32: the trainer side joins through nccl_common (the engine class has no trainer_init);
        # with no store there is no barrier: connect_engine runs this and the workers' init together
        from vllm.distributed.weight_transfer.nccl_common import uid_init_process_group

        if self.unique_id is None:
            raise RuntimeError(
                "NCCL weight transfer: init_info() mints the id connect() joins with"
            )
        index = self.device.index if self.device.index is not None else torch.cuda.current_device()
        self.group = uid_init_process_group(
            self.unique_id, rank=0, world_size=self.world_size, device=index
        )

    def update_info(self, bucket: Bucket, tensors: Sequence[torch.Tensor]) -> dict:
        # unpacked: one broadcast per tensor, in this order
        return bucket.update_info()

    def send(self, bucket: Bucket, tensors: Sequence[torch.Tensor]) -> None:
        if self.group is None:
            raise RuntimeError("NCCL weight transfer not connected")
        stream = torch.cuda.current_stream(self.device)
        for tensor in tensors:
            self.group.broadcast(tensor, src=0, stream=stream)
        # the staging copy is reused once applied() returns
        stream.synchronize()

    def close(self) -> None:
        self.group = None
