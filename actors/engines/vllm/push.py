"""vLLM's weight-transfer protocol, as the vLLM actor drives it against its own local engine.

The vLLM actor process is the *trainer side* of vLLM's weight transfer for its
own local engine: ``init_weight_transfer_engine(WeightTransferInitRequest(init_info=...))``
once (``connect_engine``), then per version ``start_weight_update()``, ``update_weights(
WeightTransferUpdateRequest(update_info=...))`` per step and
``finish_weight_update(weight_version="<label>")``, all between
``pause_generation(mode="keep", clear_cache=True)`` and ``resume_generation()``
so requests in flight survive the swap (``push_weights``;
https://docs.vllm.ai/en/latest/training/weight_transfer/,
https://docs.vllm.ai/en/latest/training/async_rl/). Each final
``CompletionOutput`` then carries ``weight_versions`` spans (``.start``,
``.end``, ``.version`` = the label), turned into the per-token versions the
wire format carries (``outputs.token_versions``).

A version is a plan of steps: one per bucket of a staged set for the ``ipc`` and ``nccl``
backends (``sender_plan``), or one naming an announced slot for the ``streamrl_shm`` and
``streamrl_cuda_ipc`` backends, whose workers load it themselves (``shm_step``). Nothing here
touches vLLM or CUDA: the AsyncLLM and vLLM's request classes come in as arguments.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from streamrl.configs.errors import StreamRLError

if TYPE_CHECKING:
    import torch

    from streamrl.actors.engines.vllm.senders import Bucket, BucketSender


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
