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

Backends (``weight_transfer_config={"backend": ...}``):

- ``streamrl_shm`` (ours, one host, CPU and GPU; ``weightsync.vllm_shm_engine``,
  registered in vLLM's processes by ``weightsync.vllm_plugin``): the update
  info names the publisher's segment, slot, version, layout and aliases, and
  each worker loads the slot straight from shared memory (``shm_step``). No
  staging copy in the actor.
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

Only the senders' methods touch vLLM or CUDA (imported lazily); ``push_weights``
takes the AsyncLLM and vLLM's request class as arguments.
"""

from __future__ import annotations

import asyncio
import base64
import pickle
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from streamrl.configs.errors import StreamRLError
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


# -- the protocol ----------------------------------------------------------------------------


class PushFailed(StreamRLError, RuntimeError):
    """A version could not be pushed; the engine was restored to ``restored`` (a complete version)."""

    def __init__(self, version: int, restored: int | None, detail: str) -> None:
        super().__init__(detail)
        self.version = version
        self.restored = restored


class EngineFailed(StreamRLError, RuntimeError):
    """The engine cannot be trusted to serve any complete version any more: the actor must end."""


@dataclass(frozen=True)
class Step:
    """One ``update_weights`` call: its update info and this process's data plane beside it."""

    update_info: dict
    send: Callable[[], None] | None = None


Plan = Sequence[Step]


async def _bounded(awaitable: Awaitable, timeout_s: float | None, what: str):
    try:
        return await asyncio.wait_for(awaitable, timeout_s)
    except asyncio.TimeoutError:
        # the engine-side call is still running and every later call queues behind it
        raise EngineFailed(
            f"vLLM {what} did not return within {timeout_s} s; the engine cannot take weights any more"
        ) from None


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
        "init_weight_transfer_engine",
    )


def sender_plan(
    buckets: Sequence[Bucket], staged: Mapping[str, torch.Tensor], sender: BucketSender
) -> list[Step]:
    """One step per bucket of a staged set, sent by ``sender`` (the ipc and nccl backends)."""
    steps = []
    for bucket in buckets:
        tensors = bucket.tensors(staged)
        steps.append(
            Step(
                sender.update_info(bucket, tensors),
                lambda b=bucket, t=tensors: sender.send(b, t),
            )
        )
    return steps


def shm_step(version: int, meta: Mapping[str, Any]) -> Step:
    """The ``streamrl_shm`` backend's one step for an announced shm version: the workers read the slot."""
    return Step(
        {
            "segment": meta["segment"],
            "slot": int(meta["slot"]),
            "version": version,
            "layout": meta["layout"],
            "aliases": dict(meta["aliases"]),
        }
    )


async def _load(llm, version: int, plan: Plan, update_request, timeout_s) -> None:
    """start -> one update per step (its send beside it) -> finish with the version label."""
    await _bounded(llm.start_weight_update(), timeout_s, "start_weight_update")
    for step in plan:
        calls = [llm.update_weights(update_request(step.update_info))]
        if step.send is not None:
            calls.append(asyncio.to_thread(step.send))
        await _bounded(asyncio.gather(*calls), timeout_s, "update_weights")
    await _bounded(
        llm.finish_weight_update(weight_version=str(version)), timeout_s, "finish_weight_update"
    )


async def push_weights(
    llm,
    version: int,
    plan: Plan,
    update_request: Callable[[dict], Any],
    timeout_s: float | None = None,
    fallback: Callable[[], Awaitable[tuple[int, Plan] | None]] | None = None,
) -> None:
    """Swap a version into a running vLLM AsyncLLM, requests in flight kept.

    Generation pauses (mode "keep") for the push only. The version label is
    committed by ``finish_weight_update`` only after every step arrived.
    ``clear_cache=True`` drops the KV cache, so every token after the resume is
    computed with the new weights only.

    After ``start_weight_update`` every layer is on ``meta`` until a complete
    version is loaded, and vLLM has no abort: a failed step is followed by a
    second start and a full push of the complete version ``fallback()`` names,
    then finish and resume, and ``PushFailed`` says which version the engine
    serves. Without one, or when that fails too, or when a call outlives
    ``timeout_s`` (the engine-side call keeps running and blocks every later
    one), ``EngineFailed``: the engine must not generate again.
    """
    await _bounded(llm.pause_generation(mode="keep", clear_cache=True), timeout_s, "pause")
    try:
        try:
            await _load(llm, version, plan, update_request, timeout_s)
            return
        except EngineFailed:
            raise
        except Exception as exc:
            failure = exc
        restore = await fallback() if fallback is not None else None
        if restore is None:
            raise EngineFailed(
                f"pushing version {version} failed ({_first_line(failure)}) and no complete version is left to restore"
            ) from failure
        restored, restore_plan = restore
        try:
            await _load(llm, restored, restore_plan, update_request, timeout_s)
        except Exception as exc:
            raise EngineFailed(
                f"pushing version {version} failed ({_first_line(failure)}) and restoring version {restored} failed too"
            ) from exc
        raise PushFailed(version, restored, _first_line(failure)) from failure
    finally:
        await _bounded(llm.resume_generation(), timeout_s, "resume_generation")


def _first_line(exc: BaseException) -> str:
    # torch and vLLM errors carry long traces: keep the first line
    return (str(exc) or type(exc).__name__).splitlines()[0][:300]
