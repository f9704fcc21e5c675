"""The vLLM engine: a thin adapter around ``vllm.v1.engine.async_llm.AsyncLLM`` (GPU, or the CPU build).

vLLM is an optional extra (``streamrl[vllm]`` on GPUs; ``make .venv-vllm``
builds the CPU build's own venv) and is imported only when this engine is
built (``VLLM.from_config``, in the package's ``__init__``). Pure functions (the engine arguments
there, the sampling arguments and the conversion of a vLLM ``CompletionOutput`` into our ``Output`` in ``outputs``) are
tested without vLLM; the engine itself is tested against the real vLLM CPU build.

Behaviour log-probs: ``SamplingParams(logprobs=0)`` returns the sampled token's
log-prob, and the engine argument ``logprobs_mode="processed_logprobs"`` makes
it the log-prob after temperature/top-k/top-p (the default is the raw model
distribution).

Weights, pushed by a task on the engine's event loop through vLLM's native
protocol inside ``pause_generation(mode="keep")``
(``push.push_weights``), so requests in flight keep going
across a swap:

- ``weightsync.transport=shm``: the task follows the learner's announcements
  and hands each new version's slot to the ``streamrl_shm`` backend, whose
  workers load it straight from shared memory (no subscriber, no staging copy).
- ``cuda_ipc``: the same with the ``streamrl_cuda_ipc`` backend, whose workers open the
  learner's GPU slots by CUDA IPC handle and load from them in place.
- ``dist``: the actor's subscriber stages each version on ``actor.device`` and
  the task pushes it over CUDA IPC (one GPU) or NCCL (tensor parallel).

With LoRA adapters travelling alone (``model.lora.sync: adapter``) there is no weight transfer:
the actor's subscriber stages each version's adapters (over any transport) and the engine loads
them as a new LoRA adapter of the running engine (``policy.lora.AdapterVersions``); a request keeps the
adapter it started with, so its tokens carry that version.

A push that fails restores a complete version before generation resumes
(counted in ``streamrl_weights_transfer_failures_total{reason="engine_push"}``);
an engine that cannot be restored, or that dies, makes ``generate`` raise
``EngineFailed`` so the actor ends and its supervisor restarts it.
Per-token versions: the version label set by ``finish_weight_update`` comes
back as ``weight_versions`` spans on each completion
(``outputs.token_versions``).

Multi-turn trajectories: each turn is a request whose prompt is the trajectory's
token ids so far (a ``TokensPrompt``, nothing decoded and re-encoded); the prefix
cache finds the blocks of the turns before it (``meta["cached_tokens"]``), so a
turn prefills little more than what the environment appended. A swap clears the
prefix cache (``pause_generation(clear_cache=True)``): a turn after one
recomputes its whole sequence under the new weights, as the hf engine does.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from types import SimpleNamespace
from typing import TYPE_CHECKING

from streamrl.actors import metrics
from streamrl.actors.engines.base import (
    Engine,
    Output,
    RefillPacer,
    Request,
    SamplingParams,
    WeightSource,
)
from streamrl.actors.engines.spec import EngineUnavailable
from streamrl.actors.engines.vllm.outputs import aborted_output, sampling_kwargs, to_output
from streamrl.actors.engines.vllm.push import (
    EngineFailed,
    Plan,
    PushFailed,
    connect_engine,
    push_weights,
    sender_plan,
    shm_step,
)
from streamrl.actors.engines.vllm.senders import BucketSender, staged_buckets
from streamrl.policy.lora import AdapterVersions
from streamrl.weightsync import metrics as weight_metrics

if TYPE_CHECKING:
    pass

log = logging.getLogger(__name__)

ABORT_POLL_S = 0.05
# how often the weight task looks for a new version
WEIGHT_POLL_S = 0.05


def import_vllm() -> SimpleNamespace:
    try:
        import vllm
        from vllm.config import WeightTransferConfig
        from vllm.distributed.weight_transfer.base import (
            WeightTransferInitRequest,
            WeightTransferUpdateRequest,
        )
        from vllm.lora.request import LoRARequest
        from vllm.v1.engine.async_llm import AsyncLLM
    except ImportError as exc:
        raise EngineUnavailable(
            "actor.engine=vllm needs vLLM: pip install 'streamrl[vllm]' on a GPU host, "
            f"or `make .venv-vllm` for the CPU build ({exc})"
        ) from None
    return SimpleNamespace(
        vllm=vllm,
        AsyncLLM=AsyncLLM,
        WeightTransferConfig=WeightTransferConfig,
        InitRequest=WeightTransferInitRequest,
        UpdateRequest=WeightTransferUpdateRequest,
        LoRARequest=LoRARequest,
    )


class VLLMEngine(Engine):
    """Sync facade: AsyncLLM runs on a private event loop thread; ``generate`` blocks on it.

    Weights come from one of two sources. ``announcements`` (a callable
    returning the newest shm ``Announcement``): each newer version is pushed
    through the ``streamrl_shm`` backend. ``weight_source`` (the actor's
    subscriber) with a ``sender``: each staged version is pushed over IPC or
    NCCL, ``applied(version)`` after it, ``rejected(version)`` after a failure.
    A failed version is not tried again; a newer one is.
    """

    def __init__(self, args: dict, seed: int = 0, **weights) -> None:
        """A new AsyncLLM of engine arguments ``args`` (``engine_args``); ``weights``: where its
        weights come from, as ``with_llm`` takes them (``weight_source``, ``sender``,
        ``announcements``, ``bucket_bytes``, ``timeout_s``, ``adapters``)."""
        api = import_vllm()
        self._start_loop()
        try:
            llm = self._call(self._create(api, args))
        except BaseException:
            self._stop_loop()
            raise
        try:
            self._call(_warm_up(llm, api.vllm.SamplingParams))
        except BaseException:
            llm.shutdown()
            self._stop_loop()
            raise
        self._setup(
            llm,
            seed=seed,
            sampling_params=api.vllm.SamplingParams,
            init_request=lambda info: api.InitRequest(init_info=info),
            update_request=lambda info: api.UpdateRequest(update_info=info),
            poll_s=WEIGHT_POLL_S,
            slots=args.get("max_num_seqs"),
            **weights,
        )

    def start_receiving(self, subscriber) -> None:
        """Start the subscriber this engine owns: only once the engine stands, since vLLM sizes its
        KV cache from the GPU memory free when it starts."""
        if subscriber is not None:
            self.owned = subscriber.start()

    @classmethod
    def with_llm(
        cls,
        llm,
        *,
        weight_source: WeightSource | None = None,
        sender: BucketSender | None = None,
        announcements: Callable[[], object] | None = None,
        seed: int = 0,
        bucket_bytes: int = 64 << 20,
        timeout_s: float = 30.0,
        poll_s: float = WEIGHT_POLL_S,
        sampling_params: Callable | None = None,
        init_request: Callable[[dict], object] | None = None,
        update_request: Callable[[dict], object] | None = None,
        adapters: AdapterVersions | None = None,
        slots: int | None = None,
    ) -> VLLMEngine:
        """An engine around an already built AsyncLLM (one engine shared by several tests).

        Request builders and ``sampling_params`` default to vLLM's own classes
        (imported only when one is left out).
        """
        if sampling_params is None or init_request is None or update_request is None:
            api = import_vllm()
            sampling_params = sampling_params or api.vllm.SamplingParams
            init_request = init_request or (lambda info: api.InitRequest(init_info=info))
            update_request = update_request or (lambda info: api.UpdateRequest(update_info=info))
        self = cls.__new__(cls)
        self._start_loop()
        self._setup(
            llm,
            seed=seed,
            weight_source=weight_source,
            sender=sender,
            announcements=announcements,
            sampling_params=sampling_params,
            init_request=init_request,
            update_request=update_request,
            bucket_bytes=bucket_bytes,
            timeout_s=timeout_s,
            poll_s=poll_s,
            adapters=adapters,
            slots=slots,
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
        sampling_params,
        init_request,
        update_request,
        poll_s,
        weight_source=None,
        sender=None,
        announcements=None,
        bucket_bytes=64 << 20,
        timeout_s=30.0,
        adapters=None,
        slots=None,
    ) -> None:
        self.llm = llm
        # requests in flight a refill keeps up (vLLM's max_num_seqs: more would only queue)
        self.slots = slots or _max_num_seqs(llm)
        self.adapters = adapters
        # the subscriber this engine started and closes (``from_config``)
        self.owned = None
        self.version = 0
        self.seed = seed
        self.weight_source = weight_source
        self.sender = sender
        self.announcements = announcements
        self.bucket_bytes = bucket_bytes
        self.timeout_s = timeout_s
        self.poll_s = poll_s
        self.push_failures = 0
        self.failed: EngineFailed | None = None
        self._sampling_params = sampling_params
        self._update_request = update_request
        self._weights: asyncio.Task | None = None
        self._live_meta: dict | None = None
        self._live_publisher: str | None = None
        self._refused: set[tuple[str, int]] = set()
        if weight_source is None and announcements is None:
            return
        if adapters is not None:
            try:
                self._weights = self._call(self._spawn(self._follow_adapters()))
            except BaseException:
                self.close()
                raise
            return
        if weight_source is not None and sender is None:
            raise ValueError("a vLLM engine with a weight source needs a sender for its backend")
        try:
            if sender is not None:
                self._call(connect_engine(llm, sender, init_request, timeout_s))
            else:
                # the workers' lease on a slot lasts as long as one push may take
                self._call(
                    llm.init_weight_transfer_engine(init_request({"lease_s": float(timeout_s)}))
                )
            follow = self._follow_staged() if sender is not None else self._follow_shm()
            self._weights = self._call(self._spawn(follow))
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

    @property
    def max_positions(self) -> int:
        """The longest sequence a request may reach (multi-turn budgets: ``actors.trajectory``)."""
        return self.llm.model_config.max_model_len

    # -- weights -------------------------------------------------------------------------------

    def maybe_swap_weights(self) -> None:
        """Called by the actor between batches: pushes run on their own; this surfaces a dead engine."""
        if self.failed is not None:
            raise self.failed

    async def _follow_shm(self) -> None:
        """Push every newer announced shm version; the workers read the slot themselves."""
        while True:
            try:
                ann = await asyncio.to_thread(self.announcements)
            except Exception as exc:
                # a Redis hiccup: keep the weights, try again
                log.warning("vLLM engine: reading the weight announcement failed: %r", exc)
                ann = None
            if ann is None or not self._wanted(ann):
                await asyncio.sleep(self.poll_s)
                continue
            await self.push_announcement(ann)

    def _wanted(self, ann) -> bool:
        if (ann.publisher, ann.version) in self._refused:
            return False
        # a restarted learner (new publisher id) is authoritative even if it restarted the count
        return ann.publisher != self._live_publisher or ann.version > self.version

    async def push_announcement(self, ann) -> bool:
        """Push one announced shm version; after a failure the live slot (or the newest) is restored."""

        async def fallback() -> tuple[int, Plan] | None:
            newest = await asyncio.to_thread(self.announcements) if self.announcements else None
            candidates = []
            if self._live_meta is not None:
                candidates.append((self.version, self._live_meta, self._live_publisher))
            if newest is not None and (newest.publisher, newest.version) != key:
                candidates.append((newest.version, newest.meta, newest.publisher))
            for version, meta, publisher in candidates:
                if _slot_holds(meta, version):
                    restored["publisher"], restored["meta"] = publisher, meta
                    return version, [shm_step(version, meta)]
            return None

        key = (ann.publisher, ann.version)
        restored: dict = {}
        ok = await self._push(ann.version, [shm_step(ann.version, ann.meta)], fallback)
        if ok:
            self._live_meta, self._live_publisher = ann.meta, ann.publisher
            self.weights_from = ann.meta["segment"]
        else:
            self._refused.add(key)
            if restored:
                self._live_meta, self._live_publisher = restored["meta"], restored["publisher"]
                self.weights_from = restored["meta"]["segment"]
        return ok

    async def _next_staged(self) -> tuple[int, dict]:
        """The next version the subscriber stages (lent until ``applied`` or ``rejected``)."""
        while True:
            try:
                staged = self.weight_source.take_staged()
            except Exception:
                # a broken source must not end the task; the actor keeps its weights
                log.exception("vLLM engine: taking staged weights failed")
                staged = None
            if staged is not None:
                return staged
            if self.adapters is not None:
                try:
                    await self.adapters.drop_unused(self.llm)
                except Exception as exc:
                    log.warning("vLLM engine: removing unused adapters failed: %r", exc)
            await asyncio.sleep(self.poll_s)

    async def _follow_staged(self) -> None:
        """Between requests and while they run: push every version the subscriber stages."""
        while True:
            version, tensors = await self._next_staged()
            plan = sender_plan(staged_buckets(tensors, self.bucket_bytes), tensors, self.sender)

            async def fallback(version=version, plan=plan) -> tuple[int, Plan]:
                # the staged set is complete and still lent: push it once more, whole
                return version, plan

            if await self._push(version, plan, fallback):
                self.weight_source.applied(version)
            else:
                self.weight_source.rejected(version)

    async def _follow_adapters(self) -> None:
        """Load every version the subscriber stages as a new LoRA adapter; drop adapters no request
        uses while waiting for the next."""
        while True:
            version, tensors = await self._next_staged()
            start = time.perf_counter()
            try:
                await asyncio.wait_for(
                    self.adapters.load(self.llm, version, tensors), self.timeout_s
                )
            except Exception as exc:
                # vLLM refused it (or the engine is gone: the next generate says so)
                self.push_failures += 1
                weight_metrics.TRANSFER_FAILURES.labels(reason="engine_push").inc()
                log.warning(
                    "vLLM engine: loading the adapter of version %d failed: %r", version, exc
                )
                self.weight_source.rejected(version)
            else:
                metrics.WEIGHT_SWAP_SECONDS.observe(time.perf_counter() - start)
                self._serve(version)
                self.weight_source.applied(version)

    async def _push(
        self, version: int, plan: Plan, fallback: Callable[[], Awaitable[tuple[int, Plan] | None]]
    ) -> bool:
        start = time.perf_counter()
        try:
            await push_weights(
                self.llm, version, plan, self._update_request, self.timeout_s, fallback
            )
        except PushFailed as exc:
            self.push_failures += 1
            weight_metrics.TRANSFER_FAILURES.labels(reason="engine_push").inc()
            # the second, whole push of the same version went through
            if exc.restored == version:
                self._serve(version)
                return True
            log.warning(
                "vLLM engine: pushing version %d failed, serving version %s: %s",
                version,
                exc.restored,
                exc,
            )
            self._serve(exc.restored)
            return False
        except Exception as exc:
            self.push_failures += 1
            weight_metrics.TRANSFER_FAILURES.labels(reason="engine_push").inc()
            self.failed = (
                exc
                if isinstance(exc, EngineFailed)
                else EngineFailed(f"pushing version {version} failed: {exc!r}")
            )
            log.error("vLLM engine: %s; the actor must restart", self.failed)
            raise self.failed from exc
        metrics.WEIGHT_SWAP_SECONDS.observe(time.perf_counter() - start)
        self._serve(version)
        return True

    # -- generation ----------------------------------------------------------------------------

    def generate(
        self,
        requests: Sequence[Request],
        params: SamplingParams,
        should_abort: Callable[[], bool] | None = None,
        refill: Callable[[int], Sequence[Request]] | None = None,
        on_finished: Callable[[int, Output], None] | None = None,
    ) -> list[Output]:
        """As ``Engine.generate``: every request is submitted at once and vLLM's scheduler batches
        them; ``refill`` is asked for more while fewer than ``slots`` run."""
        if self.failed is not None:
            raise self.failed
        run = _Requests(self, params, on_finished)
        outputs = self._call(run.complete(requests, should_abort, refill))
        metrics.TOKENS_GENERATED.inc(sum(len(o.token_ids) for o in outputs))
        return outputs

    async def _one(self, request: Request, vllm_id: str, sampling) -> Output:
        start_version = self.version
        # LoRA adapter versions: the request keeps the adapter it starts with, its tokens that version
        held = self.adapters.acquire() if self.adapters is not None else None
        if held is not None:
            start_version = held[0]
        final = None
        try:
            async for out in self.llm.generate(
                # a TokensPrompt: the ids as they are, never detokenized
                {"prompt_token_ids": request.prompt_token_ids},
                sampling,
                vllm_id,
                lora_request=held[1] if held is not None else None,
            ):
                final = out
        finally:
            if self.adapters is not None:
                self.adapters.release(held)
        # aborted before its first token
        if final is None:
            return aborted_output(request.request_id)
        output = to_output(request.request_id, final.outputs[0], start_version)
        # prompt tokens found in the prefix cache (a multi-turn turn: the turns before it)
        output.meta["cached_tokens"] = final.num_cached_tokens or 0
        return output

    def close(self) -> None:
        if not self._loop.is_running():
            return
        if self._weights is not None:
            # a push in flight still resumes generation
            try:
                self._call(_cancel(self._weights), self.timeout_s + 5)
            except Exception as exc:
                log.warning("vLLM engine: stopping the weight task: %r", exc)
            self._weights = None
        self.llm.shutdown()
        for part in (self.sender, self.announcements, self.adapters, self.owned):
            if part is not None and hasattr(part, "close"):
                part.close()
        self._stop_loop()


class _Requests:
    """One ``generate`` call's requests, each a task on the engine's loop."""

    def __init__(self, engine: VLLMEngine, params: SamplingParams, on_finished) -> None:
        self.engine = engine
        self.sampling = engine._sampling_params(**sampling_kwargs(params))
        self.on_finished = on_finished
        # (request, vLLM request id, task), in the order the caller gave them
        self.started: list[tuple[Request, str, asyncio.Task]] = []

    def start(self, request: Request) -> asyncio.Task:
        vllm_id = f"{request.request_id}-{uuid.uuid4().hex[:8]}"
        task = asyncio.create_task(self.engine._one(request, vllm_id, self.sampling))
        if self.on_finished is not None:
            task.add_done_callback(functools.partial(self._finished, len(self.started)))
        self.started.append((request, vllm_id, task))
        return task

    def _finished(self, index: int, task: asyncio.Task) -> None:
        if task.cancelled() or task.exception() is not None:
            return
        output = task.result()
        if output.finish_reason != "abort":
            self.on_finished(index, output)

    async def complete(self, requests, should_abort, refill) -> list[Output]:
        for request in requests:
            self.start(request)
        engine = self.engine
        pacer = RefillPacer()
        aborted = False
        while True:
            if engine.failed is not None or (should_abort is not None and should_abort()):
                await engine.llm.abort([vid for _, vid, task in self.started if not task.done()])
                aborted = True
                break
            running = [task for _, _, task in self.started if not task.done()]
            room = engine.slots - len(running)
            if refill is not None and room > 0 and pacer.due(idle=not running):
                # refill may wait on the actor's event loop (admission asks Redis): off this one
                more = list(await asyncio.to_thread(refill, room))
                pacer.gave(more)
                running += [self.start(request) for request in more]
            if not running:
                break
            await asyncio.wait(running, timeout=ABORT_POLL_S, return_when=asyncio.FIRST_COMPLETED)
        return await self._outputs(aborted)

    async def _outputs(self, aborted: bool) -> list[Output]:
        done = await asyncio.gather(*(task for _, _, task in self.started), return_exceptions=True)
        if self.engine.failed is not None:
            raise self.engine.failed
        errors = [d for d in done if isinstance(d, BaseException)]
        if errors and not aborted:
            # a dead engine answers every request with an error: never turn that into empty output
            raise EngineFailed(f"vLLM engine failed while generating: {errors[0]!r}") from errors[0]
        return [
            d if isinstance(d, Output) else aborted_output(r.request_id)
            for (r, _, _), d in zip(self.started, done, strict=True)
        ]


def _max_num_seqs(llm) -> int:
    """The engine's ``max_num_seqs`` (its scheduler's batch), or vLLM's default where it has none."""
    scheduler = getattr(getattr(llm, "vllm_config", None), "scheduler_config", None)
    return int(getattr(scheduler, "max_num_seqs", None) or 256)


def _slot_holds(meta: dict, version: int) -> bool:
    """Whether the announced slot still holds ``version`` (the segment may be gone or the slot
    reused): its stamps, in a shm segment or a cuda_ipc control segment alike; the workers check
    the bytes against their checksums when they load them."""
    from streamrl.weightsync.transports.shm.segment import SegmentReader

    try:
        reader = SegmentReader(meta["segment"], lease_s=1.0, kind=None)
    except (OSError, ValueError):
        return False
    try:
        slot = int(meta["slot"])
        return 0 <= slot < reader.slots and reader.hold(version, slot) and reader.release()
    finally:
        reader.close()


async def _warm_up(llm, sampling_params) -> None:
    """Sampling steps with log-probs at batch 1, then 2, before the engine takes any weights.

    vLLM compiles the kernel that ranks sampled tokens' log-probs (torch.compile, inductor, g++) on
    first use even with enforce_eager, and again for a second batch size. The first time on a
    machine (later processes load it from torch's cache) that took more than 30 s on the loaded
    2-core machine here: inside a push it held pause_generation past weightsync.timeout_s and the
    actor had to restart. Here it is part of the start.
    """

    async def one(request_id: str, max_tokens: int) -> None:
        params = sampling_params(max_tokens=max_tokens, logprobs=0)
        async for _ in llm.generate({"prompt_token_ids": [0]}, params, request_id):
            pass

    await one("warm-up-0", 1)
    await asyncio.gather(one("warm-up-1", 2), one("warm-up-2", 2))


async def _cancel(task: asyncio.Task) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
