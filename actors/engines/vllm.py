"""The vLLM engine (GPU): a thin adapter around ``vllm.v1.engine.async_llm.AsyncLLM``.

vLLM is an optional extra (``pip install 'streamrl[vllm]'``) and is imported
only when this engine is built. Everything that needs no GPU lives in pure
functions here and is tested on CPU: engine arguments, sampling arguments, the
conversion of a vLLM ``CompletionOutput`` into our ``Output``, and the weight
task's orchestration (``VLLMEngine.with_llm`` takes an already built AsyncLLM
or a stand-in).

Behaviour log-probs: ``SamplingParams(logprobs=0)`` returns the sampled token's
log-prob, and the engine argument ``logprobs_mode="processed_logprobs"`` makes
it the log-prob after temperature/top-k/top-p (the default is the raw model
distribution). Weights: the actor's weightsync subscriber stages each new
version on ``actor.device``; a task on the engine's event loop takes it
(``weight_source.take_staged()``) and pushes it through vLLM's native
weight-transfer API inside ``pause_generation(mode="keep")``
(``weightsync.vllm_adapter.push_weights``), so requests in flight keep going
across a swap. Per-token versions: the version label set by
``finish_weight_update`` comes back as ``weight_versions`` spans on each
completion (``weightsync.vllm_adapter.token_versions``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from types import SimpleNamespace

import numpy as np

from actors import metrics
from actors.engines.base import Engine, Output, Request, SamplingParams, WeightSource
from weightsync import metrics as weight_metrics
from weightsync.vllm_adapter import (
    BucketSender,
    IPCSender,
    NCCLSender,
    connect_engine,
    push_weights,
    staged_buckets,
    token_versions,
)

log = logging.getLogger(__name__)

ABORT_POLL_S = 0.05
WEIGHT_POLL_S = 0.05  # how often the weight task looks for a staged version


class VLLMUnavailable(ImportError):
    pass


def _import_vllm() -> SimpleNamespace:
    try:
        import vllm
        from vllm.config import WeightTransferConfig
        from vllm.distributed.weight_transfer.base import (
            WeightTransferInitRequest,
            WeightTransferUpdateRequest,
        )
        from vllm.v1.engine.async_llm import AsyncLLM
    except ImportError as exc:
        raise VLLMUnavailable(
            f"actor.engine=vllm needs vLLM >= 0.33 on a GPU machine: pip install 'streamrl[vllm]' ({exc})"
        ) from None
    return SimpleNamespace(
        vllm=vllm,
        AsyncLLM=AsyncLLM,
        WeightTransferConfig=WeightTransferConfig,
        InitRequest=WeightTransferInitRequest,
        UpdateRequest=WeightTransferUpdateRequest,
    )


def weight_transfer_backend(cfg) -> str:
    """The vLLM weight-transfer backend between this actor process and its own engine's workers.

    It moves the weights the subscriber staged on ``actor.device`` into the
    engine, whatever transport brought them from the learner. One GPU
    (``tensor_parallel_size=1``): ``ipc``, the staged tensors and the engine
    share that GPU (NCCL cannot put two ranks on one GPU). Tensor parallel:
    ``nccl``, a broadcast to every worker, so ``actor.device`` must then be a
    GPU the engine does not use.
    """
    return "ipc" if cfg.actor.tensor_parallel_size == 1 else "nccl"


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
        # a WeightTransferConfig(**this) when the engine is built
        "weight_transfer_config": {"backend": weight_transfer_backend(cfg)},
    }


def make_sender(cfg) -> BucketSender:
    """This process's side of ``weight_transfer_backend(cfg)``."""
    if weight_transfer_backend(cfg) == "ipc":
        return IPCSender()
    return NCCLSender(world_size=1 + cfg.actor.tensor_parallel_size, device=cfg.actor.device)


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
    if spans:  # labels that are not versions (before the first update) = the version at start
        versions = token_versions(spans, len(tokens), default=version_at_start).astype(np.int32)
    else:  # no spans: the version the request started under
        versions = np.full(len(tokens), version_at_start, dtype=np.int32)
    finish = completion.finish_reason if completion.finish_reason in ("stop", "length") else "abort"
    return Output(request_id, tokens, logprobs, versions, finish)


class VLLMEngine(Engine):
    """Sync facade: AsyncLLM runs on a private event loop thread; ``generate`` blocks on it.

    With a ``weight_source`` (the actor's subscriber) and a ``sender`` (this
    process's side of the weight-transfer backend), a task on the same loop
    polls ``take_staged()`` and pushes each staged version into the engine:
    ``applied(version)`` after a push, ``rejected(version)`` after a failed one
    (the engine keeps its version, the failure is counted and logged, the next
    version is tried as usual).
    """

    def __init__(
        self,
        args: dict,
        seed: int = 0,
        weight_source: WeightSource | None = None,
        sender: BucketSender | None = None,
        bucket_bytes: int = 64 << 20,
        timeout_s: float = 30.0,
    ) -> None:
        api = _import_vllm()
        self._start_loop()
        try:
            llm = self._call(self._create(api, args))
        except BaseException:
            self._stop_loop()
            raise
        self._setup(
            llm,
            seed=seed,
            weight_source=weight_source,
            sender=sender,
            sampling_params=api.vllm.SamplingParams,
            init_request=lambda info: api.InitRequest(init_info=info),
            update_request=lambda info: api.UpdateRequest(update_info=info),
            bucket_bytes=bucket_bytes,
            timeout_s=timeout_s,
            poll_s=WEIGHT_POLL_S,
        )

    @classmethod
    def from_config(cls, cfg, weight_source=None, seed: int = 0) -> VLLMEngine:
        sender = make_sender(cfg) if weight_source is not None else None
        if isinstance(sender, IPCSender):
            # vLLM's workers (children of this process) unpickle the CUDA IPC handles of our own staged
            # tensors only with this set (docs.vllm.ai/en/latest/training/weight_transfer/ipc/)
            os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
            log.info(
                "vLLM weight transfer over CUDA IPC (VLLM_ALLOW_INSECURE_SERIALIZATION=%s)",
                os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"],
            )
        return cls(
            engine_args(cfg, seed),
            seed,
            weight_source=weight_source,
            sender=sender,
            bucket_bytes=cfg.weightsync.bucket_bytes,
            timeout_s=cfg.weightsync.timeout_s,
        )

    @classmethod
    def with_llm(
        cls,
        llm,
        *,
        weight_source: WeightSource | None = None,
        sender: BucketSender | None = None,
        seed: int = 0,
        bucket_bytes: int = 64 << 20,
        timeout_s: float = 30.0,
        poll_s: float = WEIGHT_POLL_S,
        sampling_params: Callable | None = None,
        init_request: Callable[[dict], object] | None = None,
        update_request: Callable[[dict], object] | None = None,
    ) -> VLLMEngine:
        """An engine around an already built AsyncLLM (or a stand-in); imports nothing of vLLM.

        The request builders default to plain objects with the one attribute
        AsyncLLM reads (``init_info`` / ``update_info``).
        """
        self = cls.__new__(cls)
        self._start_loop()
        self._setup(
            llm,
            seed=seed,
            weight_source=weight_source,
            sender=sender,
            sampling_params=sampling_params,
            init_request=init_request or (lambda info: SimpleNamespace(init_info=info)),
            update_request=update_request or (lambda info: SimpleNamespace(update_info=info)),
            bucket_bytes=bucket_bytes,
            timeout_s=timeout_s,
            poll_s=poll_s,
        )
        return self

    def _start_loop(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="vllm-engine", daemon=True
        )
        self._thread.start()

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)

    def _setup(
        self,
        llm,
        *,
        seed,
        weight_source,
        sender,
        sampling_params,
        init_request,
        update_request,
        bucket_bytes,
        timeout_s,
        poll_s,
    ) -> None:
        self.llm = llm
        self.version = 0
        self.seed = seed
        self.weight_source = weight_source
        self.sender = sender
        self.bucket_bytes = bucket_bytes
        self.timeout_s = timeout_s
        self.poll_s = poll_s
        self.push_failures = 0
        self._sampling_params = sampling_params
        self._update_request = update_request
        self._weights: asyncio.Task | None = None
        if weight_source is None:
            return
        if sender is None:
            raise ValueError("a vLLM engine with a weight source needs a sender for its backend")
        try:
            self._call(connect_engine(llm, sender, init_request, timeout_s))
            self._weights = self._call(self._spawn(self._follow_weights()))
        except BaseException:
            self.close()
            raise

    async def _create(self, api, args: dict):
        args = dict(args)
        if isinstance(args.get("weight_transfer_config"), dict):
            args["weight_transfer_config"] = api.WeightTransferConfig(
                **args["weight_transfer_config"]
            )
        return api.AsyncLLM.from_engine_args(api.vllm.AsyncEngineArgs(**args))

    def _call(self, coro, timeout_s: float | None = None):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout_s)

    @staticmethod
    async def _spawn(coro) -> asyncio.Task:
        return asyncio.get_running_loop().create_task(coro)

    # -- weights -------------------------------------------------------------------------------

    async def _follow_weights(self) -> None:
        """Between requests and while they run: push every version the subscriber stages."""
        while True:
            try:
                staged = self.weight_source.take_staged()
            except Exception:  # a broken source must not end the task; the actor keeps its weights
                log.exception("vLLM engine: taking staged weights failed")
                staged = None
            if staged is None:
                await asyncio.sleep(self.poll_s)
                continue
            await self._push(*staged)

    async def _push(self, version: int, staged: dict) -> bool:
        start = time.perf_counter()
        try:
            buckets = staged_buckets(staged, self.bucket_bytes)
            await push_weights(
                self.llm,
                version,
                buckets,
                staged,
                self.sender,
                self._update_request,
                self.timeout_s,
            )
        except Exception as exc:
            self.push_failures += 1
            weight_metrics.TRANSFER_FAILURES.labels(reason="engine_push").inc()
            detail = (str(exc) or type(exc).__name__).splitlines()[0][:300]
            log.warning(
                "vLLM engine: pushing version %d failed, keeping version %d: %s",
                version,
                self.version,
                detail,
            )
            self.weight_source.rejected(version)
            return False
        metrics.WEIGHT_SWAP_SECONDS.observe(time.perf_counter() - start)
        self.weight_source.applied(version)
        self.version = version
        metrics.POLICY_VERSION.set(version)
        return True

    # -- generation ----------------------------------------------------------------------------

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
        sampling = self._sampling_params(**sampling_kwargs(params))
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

    def close(self) -> None:
        if not self._loop.is_running():
            return
        if self._weights is not None:
            try:  # a push in flight still resumes generation
                self._call(_cancel(self._weights), self.timeout_s + 5)
            except Exception as exc:
                log.warning("vLLM engine: stopping the weight task: %r", exc)
            self._weights = None
        self.llm.shutdown()
        if self.sender is not None:
            self.sender.close()
        self._stop_loop()


async def _cancel(task: asyncio.Task) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


def _empty() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return np.zeros(0, np.int32), np.zeros(0, np.float32), np.zeros(0, np.int32)
