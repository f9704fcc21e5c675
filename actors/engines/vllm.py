"""The vLLM engine (GPU): a thin adapter around ``vllm.v1.engine.async_llm.AsyncLLM``.

vLLM is an optional extra (``pip install 'streamrl[vllm]'``) and is imported
only when this engine is built. Everything that needs no GPU lives in pure
functions here and is tested on CPU: engine arguments, sampling arguments and
the conversion of a vLLM ``CompletionOutput`` into our ``Output``.

Behaviour log-probs: ``SamplingParams(logprobs=0)`` returns the sampled token's
log-prob, and the engine argument ``logprobs_mode="processed_logprobs"`` makes
it the log-prob after temperature/top-k/top-p (the default is the raw model
distribution). Per-token versions: vLLM >= 0.33 reports ``weight_versions``
spans on each completion (turned into per-token versions by
``weightsync.vllm_adapter.token_versions``); weights arrive through vLLM's
native weight-transfer API inside ``pause_generation(mode="keep")``, so
requests in flight keep going across a swap (``update_weights``).
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Callable, Sequence

import numpy as np

from actors import metrics
from actors.engines.base import Engine, Output, Request, SamplingParams
from weightsync.vllm_adapter import push_weights, token_versions

ABORT_POLL_S = 0.05


class VLLMUnavailable(ImportError):
    pass


def _import_vllm():
    try:
        import vllm
        from vllm.v1.engine.async_llm import AsyncLLM
    except ImportError as exc:
        raise VLLMUnavailable(
            f"actor.engine=vllm needs vLLM >= 0.33 on a GPU machine: pip install 'streamrl[vllm]' ({exc})"
        ) from None
    return vllm, AsyncLLM


def engine_args(cfg, seed: int = 0) -> dict:
    """AsyncEngineArgs keyword arguments for the actor's vLLM engine."""
    dtype = "auto" if cfg.model.dtype == "auto" else cfg.model.dtype
    return {
        "model": cfg.model.path,
        "dtype": dtype,
        "gpu_memory_utilization": cfg.actor.gpu_memory_utilization,
        "tensor_parallel_size": cfg.actor.tensor_parallel_size,
        "max_num_seqs": cfg.actor.batch_slots,
        "logprobs_mode": "processed_logprobs",
        "seed": seed,
        "enable_prefix_caching": True,  # the G completions of a group share their prompt
        "weight_transfer_config": {
            "backend": "nccl" if cfg.weightsync.transport == "dist" else "ipc"
        },
    }


def sampling_kwargs(params: SamplingParams, seed: int | None = None) -> dict:
    """vLLM ``SamplingParams`` keyword arguments for our sampling parameters."""
    return {
        "n": 1,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "top_k": params.top_k if params.top_k > 0 else -1,  # vLLM: -1 = off
        "max_tokens": params.max_new_tokens,
        "stop": list(params.stop) or None,
        "stop_token_ids": list(params.stop_token_ids) or None,
        "include_stop_str_in_output": True,  # the tokens the learner trains on are the ones sampled
        "logprobs": 0,  # the sampled token's log-prob only
        "seed": seed,
    }


def to_output(request_id: str, completion, version_at_start: int) -> Output:
    """A vLLM ``CompletionOutput`` -> our ``Output`` (behaviour log-probs and per-token versions)."""
    tokens = np.asarray(list(completion.token_ids), dtype=np.int32)
    if completion.logprobs is None or len(completion.logprobs) != len(tokens):
        raise ValueError(
            f"request {request_id}: vLLM returned no per-token log-probs; it needs SamplingParams(logprobs=0)"
        )
    logprobs = np.asarray(
        [step[int(token)].logprob for step, token in zip(completion.logprobs, tokens, strict=True)],
        dtype=np.float32,
    )
    spans = getattr(completion, "weight_versions", None)
    if spans:
        versions = token_versions(spans, len(tokens)).astype(np.int32)
    else:  # vLLM < 0.33: no spans; the version the request started under
        versions = np.full(len(tokens), version_at_start, dtype=np.int32)
    finish = completion.finish_reason if completion.finish_reason in ("stop", "length") else "abort"
    return Output(request_id, tokens, logprobs, versions, finish)


class VLLMEngine(Engine):
    """Sync facade: AsyncLLM runs on a private event loop thread; ``generate`` blocks on it."""

    def __init__(self, args: dict, seed: int = 0) -> None:
        vllm, AsyncLLM = _import_vllm()
        self._vllm = vllm
        self.version = 0
        self.seed = seed
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="vllm-engine", daemon=True
        )
        self._thread.start()
        self.llm = self._call(self._create(AsyncLLM, args))

    @classmethod
    def from_config(cls, cfg, weight_source=None, seed: int = 0) -> VLLMEngine:
        # weight_source is unused: vLLM receives weights through its own transfer engine (update_weights)
        return cls(engine_args(cfg, seed), seed)

    async def _create(self, AsyncLLM, args: dict):
        return AsyncLLM.from_engine_args(self._vllm.AsyncEngineArgs(**args))

    def _call(self, coro, timeout_s: float | None = None):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout_s)

    def generate(
        self,
        requests: Sequence[Request],
        params: SamplingParams,
        should_abort: Callable[[], bool] | None = None,
    ) -> list[Output]:
        outputs = self._call(self._generate_all(requests, params, should_abort))
        metrics.TOKENS_GENERATED.inc(sum(len(o.token_ids) for o in outputs))
        return outputs

    async def _generate_all(self, requests, params, should_abort) -> list[Output]:
        sampling = self._vllm.SamplingParams(**sampling_kwargs(params))
        ids = {r.request_id: f"{r.request_id}-{uuid.uuid4().hex[:8]}" for r in requests}
        tasks = [asyncio.create_task(self._one(r, ids[r.request_id], sampling)) for r in requests]
        while not all(t.done() for t in tasks):
            if should_abort is not None and should_abort():
                await self.llm.abort(list(ids.values()))
                break
            await asyncio.wait(tasks, timeout=ABORT_POLL_S)
        done = await asyncio.gather(*tasks, return_exceptions=True)
        return [
            d if isinstance(d, Output) else Output(r.request_id, *_empty(), finish_reason="abort")
            for r, d in zip(requests, done, strict=True)
        ]

    async def _one(self, request: Request, vllm_id: str, sampling) -> Output:
        start_version = self.version
        final = None
        async for out in self.llm.generate(
            {"prompt_token_ids": request.prompt_token_ids}, sampling, vllm_id
        ):
            final = out
        return to_output(request.request_id, final.outputs[0], start_version)

    def update_weights(self, version: int, buckets, send_bucket) -> None:
        """Swap in ``version`` without dropping requests in flight (see weightsync.vllm_adapter)."""
        self._call(push_weights(self.llm, version, buckets, send_bucket))
        self.version = version
        metrics.POLICY_VERSION.set(version)

    def close(self) -> None:
        if self._loop.is_running():
            self.llm.shutdown()
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=30)


def _empty() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return np.zeros(0, np.int32), np.zeros(0, np.float32), np.zeros(0, np.int32)
