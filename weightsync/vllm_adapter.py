"""The GPU-free logic of the vLLM actor's weight path, plus the thin senders that call vLLM/CUDA.

The vLLM actor process is the *trainer side* of vLLM's weight transfer for its
own local engine: the weightsync subscriber stages a version in tensors on the
actor's device, and the engine pushes them into its AsyncLLM with vLLM's
four-phase protocol (https://docs.vllm.ai/en/latest/training/weight_transfer/):
``init_weight_transfer_engine(WeightTransferInitRequest(init_info=...))`` once,
then per version ``start_weight_update()``, ``update_weights(
WeightTransferUpdateRequest(update_info=...))`` per bucket and
``finish_weight_update(weight_version="<label>")``, all between
``pause_generation(mode="keep", clear_cache=True)`` and ``resume_generation()``
so requests in flight survive the swap
(https://docs.vllm.ai/en/latest/training/async_rl/). Each final
``CompletionOutput`` then carries ``weight_versions`` spans (``.start``,
``.end``, ``.version`` = the label), turned here into the per-token versions
the wire format carries.

Backends (``weight_transfer_config={"backend": ...}``) differ only in how one
bucket reaches the engine's workers (``BucketSender``):

- ``ipc`` (CUDA IPC, the staged tensors and the engine on the same GPU): no
  init; the update info carries ``names``, ``dtype_names``, ``shapes`` and
  ``ipc_handles_pickled`` (base64 pickle of ``[{gpu uuid: reduce_tensor(t)}]``),
  which the workers unpickle only with ``VLLM_ALLOW_INSECURE_SERIALIZATION=1``
  (https://docs.vllm.ai/en/latest/training/weight_transfer/ipc/).
- ``nccl`` (the staged tensors on a GPU the engine does not use): init info
  ``master_address``, ``master_port``, ``rank_offset=1``, ``world_size`` =
  1 + the engine's workers; this process joins as rank 0 through
  ``nccl_common.stateless_init_process_group`` and broadcasts each tensor of a
  bucket (in update-info order) while ``update_weights`` receives it; the
  update info is ``names``, ``dtype_names``, ``shapes`` (unpacked)
  (https://docs.vllm.ai/en/latest/api/vllm/distributed/weight_transfer/nccl_common/).

Only the senders' methods touch vLLM or CUDA (imported lazily); ``push_weights``
takes the AsyncLLM and vLLM's request class as arguments, so its orchestration
is tested on CPU with a stand-in.
"""

from __future__ import annotations

import asyncio
import base64
import pickle
import socket
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from weightsync.layout import TensorSpec


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


def _span(span) -> tuple[int, Any]:
    """``(first token index, label)`` of a vLLM span (``.start``/``.version``) or of a pair."""
    if hasattr(span, "start"):
        return int(span.start), span.version
    return int(span[0]), span[1]


def token_versions(spans: Sequence[Any], num_tokens: int, default: int | None = None) -> np.ndarray:
    """Per-token policy versions from version spans, e.g. ``[(0, 4), (7, 5)]`` or vLLM's span objects.

    vLLM's labels are strings (we set ``str(version)``); a label that is not an
    integer (the engine's label before the first update) becomes ``default``.
    Spans must start at token 0, have increasing starts inside the completion
    and non-decreasing versions (weights only move forward during a request).
    """
    if num_tokens == 0:
        return np.zeros(0, dtype=np.int64)
    if not spans:
        raise ValueError(f"no version spans for {num_tokens} tokens")
    pairs = [_span(s) for s in spans]
    starts = [start for start, _ in pairs]
    versions = [_label(label, default) for _, label in pairs]
    if starts[0] != 0:
        raise ValueError(f"version spans must start at token 0, got {starts[0]}")
    if any(b <= a for a, b in zip(starts, starts[1:], strict=False)) or starts[-1] >= num_tokens:
        raise ValueError(f"span starts {starts} must increase and lie inside {num_tokens} tokens")
    if any(b < a for a, b in zip(versions, versions[1:], strict=False)) or versions[0] < 0:
        raise ValueError(f"span versions {versions} must be non-negative and non-decreasing")
    bounds = starts[1:] + [num_tokens]
    return np.repeat(np.asarray(versions, dtype=np.int64), np.diff([0, *bounds]))


def _label(label, default: int | None) -> int:
    try:
        return int(label)
    except (TypeError, ValueError):
        if default is None:
            raise ValueError(f"weight version label {label!r} is not an integer") from None
        return default


# -- senders: how one bucket reaches the engine's workers -------------------------------------


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
        return None  # "The IPC backend requires no initialization on either side."

    def connect(self) -> None:
        pass

    def update_info(self, bucket: Bucket, tensors: Sequence[torch.Tensor]) -> dict:
        from torch.multiprocessing.reductions import reduce_tensor

        uuids: dict[torch.device, str] = {}
        handles = []
        for tensor in tensors:
            if tensor.device not in uuids:
                uuids[tensor.device] = str(torch.cuda.get_device_properties(tensor.device).uuid)
            # the staged tensors stay alive (lent by the subscriber) until update_weights returns
            handles.append({uuids[tensor.device]: reduce_tensor(tensor.detach().contiguous())})
        info = bucket.update_info()
        info["ipc_handles_pickled"] = base64.b64encode(pickle.dumps(handles)).decode("ascii")
        return info

    def send(self, bucket: Bucket, tensors: Sequence[torch.Tensor]) -> None:
        pass  # the workers read the staged tensors through the handles

    def close(self) -> None:
        pass


class NCCLSender:
    """NCCL: this process is rank 0 of a group with the engine's workers and broadcasts each tensor."""

    def __init__(
        self, world_size: int, device: str | torch.device, master_address: str = "127.0.0.1"
    ) -> None:
        self.world_size = world_size
        self.device = torch.device(device)
        self.master_address = master_address
        self.master_port = _free_port(master_address)
        self.group = None

    def init_info(self) -> dict:
        return {
            "master_address": self.master_address,
            "master_port": self.master_port,
            "rank_offset": 1,  # the workers follow this process, rank 0
            "world_size": self.world_size,
        }

    def connect(self) -> None:
        index = self.device.index if self.device.index is not None else torch.cuda.current_device()
        try:
            from vllm.distributed.weight_transfer.nccl_common import stateless_init_process_group
        except ImportError:  # vLLM releases that keep the helper on the engine class
            from vllm.distributed.weight_transfer.nccl_engine import NCCLWeightTransferEngine

            torch.cuda.set_device(index)
            self.group = NCCLWeightTransferEngine.trainer_init(
                {
                    "master_address": self.master_address,
                    "master_port": self.master_port,
                    "world_size": self.world_size,
                }
            )
            return
        self.group = stateless_init_process_group(
            self.master_address, self.master_port, 0, self.world_size, index
        )

    def update_info(self, bucket: Bucket, tensors: Sequence[torch.Tensor]) -> dict:
        return bucket.update_info()  # unpacked: one broadcast per tensor, in this order

    def send(self, bucket: Bucket, tensors: Sequence[torch.Tensor]) -> None:
        if self.group is None:
            raise RuntimeError("NCCL weight transfer not connected")
        stream = torch.cuda.current_stream(self.device)
        for tensor in tensors:
            self.group.broadcast(tensor, src=0, stream=stream)
        stream.synchronize()  # the staging copy is reused once applied() returns

    def close(self) -> None:
        self.group = None


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


# -- the protocol ----------------------------------------------------------------------------


async def _bounded(awaitable: Awaitable, timeout_s: float | None):
    return await asyncio.wait_for(awaitable, timeout_s)


async def connect_engine(
    llm, sender: BucketSender, init_request: Callable[[dict], Any], timeout_s: float | None
) -> None:
    """The init handshake: the engine's ``init_weight_transfer_engine`` and this side together."""
    info = sender.init_info()
    if info is None:
        return
    await _bounded(
        asyncio.gather(
            llm.init_weight_transfer_engine(init_request(info)), asyncio.to_thread(sender.connect)
        ),
        timeout_s,
    )


async def push_weights(
    llm,
    version: int,
    buckets: Sequence[Bucket],
    staged: Mapping[str, torch.Tensor],
    sender: BucketSender,
    update_request: Callable[[dict], Any],
    timeout_s: float | None = None,
) -> None:
    """Swap ``staged`` into a running vLLM AsyncLLM as ``version``, requests in flight kept.

    Generation pauses (mode "keep") for the push only and always resumes, also
    when a step fails; each step is bounded by ``timeout_s``. The version label
    is committed by ``finish_weight_update`` only after every bucket arrived.
    ``clear_cache=True`` (vLLM's default) drops the KV cache, so every token
    after the resume is computed with the new weights only.
    """
    try:
        await _bounded(llm.pause_generation(mode="keep", clear_cache=True), timeout_s)
        await _bounded(llm.start_weight_update(), timeout_s)
        for bucket in buckets:
            tensors = bucket.tensors(staged)
            request = update_request(sender.update_info(bucket, tensors))
            await _bounded(
                asyncio.gather(
                    llm.update_weights(request), asyncio.to_thread(sender.send, bucket, tensors)
                ),
                timeout_s,
            )
        await _bounded(llm.finish_weight_update(weight_version=str(version)), timeout_s)
    finally:
        await _bounded(llm.resume_generation(), timeout_s)
