"""One actor process: admission -> prompt -> generate G completions -> score -> publish, until stopped.

The story of an actor, top to bottom (``run_actor``): build the ``Actor``, which
loads the config-driven parts (tokenizer, prompts, rewards, policy), connects to
Redis and starts its engine and weight subscriber; serve metrics, beat a
heartbeat, then loop. Generation and reward scoring are blocking, so they run in
a worker thread while the event loop keeps the heartbeat and the admission
leases alive.

Waiting (counted in ``streamrl_actor_admission_wait_seconds_total``): while
admission control refuses a new group, and while the engine's weights are more
than ``max_staleness`` versions behind the learner. With no learner the version
stays 0 and the actor stops at the admission bound, which is the intended
behaviour. With ``actor.refill`` (hf engine) one generation keeps its decode batch
full: a freed slot takes the next admitted group's prompt, and each group is scored
and published as soon as its G completions are done, so no slot waits for the
longest completion of a batch. With ``agent.enabled`` the actor runs no rollouts of its own: it
serves the OpenAI API to agent programs (``openai_server``) and publishes the groups their calls
recorded. SIGTERM aborts the groups in flight (their leases are released, not
published) and deregisters; a SIGKILLed actor's leases and heartbeat expire.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading
import time
import uuid
import zlib
from dataclasses import dataclass, field, replace

import numpy as np
import torch

from streamrl.actors import agent_recorder, environment, inputs, metrics
from streamrl.actors.engines.base import Engine, Output, Request, SamplingParams
from streamrl.actors.engines.hf import HFEngine
from streamrl.actors.engines.vllm import VLLMEngine
from streamrl.actors.evaluation import Evaluator
from streamrl.actors.openai_server import AgentServer
from streamrl.actors.prompts import Prompt, PromptDataset, PromptSource
from streamrl.actors.reference import ReferenceScorer
from streamrl.actors.rewards import RewardInput, RewardPool, Score, failure_meta
from streamrl.actors.trajectory import Renderer, Rollouts, Trajectory, group_stats
from streamrl.broker.admission import Admission, Bounds
from streamrl.broker.audit import JsonlLog, published_path
from streamrl.broker.client import connect_async
from streamrl.broker.keys import Keys
from streamrl.broker.liveness import Heartbeats
from streamrl.broker.metrics import Endpoint, serve, unregister
from streamrl.broker.semantics import is_stale
from streamrl.broker.startup import Phases, pin_assigned
from streamrl.broker.stream import RolloutProducer
from streamrl.broker.wire import Completion, RolloutGroup
from streamrl.configs.schema import Config
from streamrl.weightsync import transports
from streamrl.weightsync.lora import adapter_targets, adapter_template, wrap
from streamrl.weightsync.policy import (
    load_policy,
    load_tokenizer,
    parameter_template,
    resolve_dtype,
)
from streamrl.weightsync.subscriber import Subscriber

log = logging.getLogger(__name__)

POLL_S = 0.05


def default_actor_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


def sampling_seed(run_seed: int, actor_id: str) -> int:
    """The seed of an actor's engine: the same in every process for the same run seed and actor id
    (``zlib.crc32``, not ``hash()``, which Python salts per process), different for other ids.

    Below 2**32: vLLM seeds numpy with it, which refuses larger seeds."""
    return (run_seed * 1_000_003 + zlib.crc32(actor_id.encode())) % (1 << 32)


def stop_token_ids(tokenizer, model_config) -> list[int]:
    ids = {tokenizer.eos_token_id}
    eos = getattr(model_config, "eos_token_id", None)
    ids.update(eos if isinstance(eos, list) else [eos])
    return sorted(i for i in ids if i is not None)


def assistant_turn(tokenizer, output: Output) -> dict:
    """The completion as the reward functions see it (actors.rewards): clean text and raw text."""
    ids = output.token_ids.tolist()
    return {
        "role": "assistant",
        "content": tokenizer.decode(ids, skip_special_tokens=True),
        # a sampled pad or chat token is part of what the model wrote; a verifier may need to see it
        "raw_content": tokenizer.decode(ids, skip_special_tokens=False),
        "finish_reason": output.finish_reason,
    }


@dataclass
class _Pending:
    """A group in flight: its lease, prompt and the completions once generated."""

    lease_id: str
    prompt: Prompt
    outputs: list[Output] = field(default_factory=list)
    # the reference policy's log-probs per output (algo.reference_on: actors)
    ref_logprobs: list[np.ndarray] | None = None
    # handed to the publisher during generation (actor.refill)
    published: bool = False
    # multi-turn (env.name): the group's trajectories, whose first messages are the prompt
    trajectories: list[Trajectory] | None = None

    @property
    def prompt_token_ids(self) -> list[int]:
        return self.trajectories[0].prompt if self.trajectories else self.prompt.token_ids


def build_group(actor_id: str, seq: int, pending: _Pending, scores: list[Score]) -> RolloutGroup:
    refs = pending.ref_logprobs or [None] * len(pending.outputs)
    completions = [
        Completion(
            o.token_ids,
            o.logprobs,
            o.versions,
            s.total,
            o.finish_reason,
            s.parts,
            ref,
            o.meta.get("loss_mask"),
        )
        for o, s, ref in zip(pending.outputs, scores, refs, strict=True)
    ]
    return RolloutGroup(
        group_id=f"{actor_id}-{seq}-{uuid.uuid4().hex[:8]}",
        prompt_id=pending.prompt.prompt_id,
        actor_id=actor_id,
        seq=seq,
        prompt_token_ids=np.asarray(pending.prompt_token_ids, dtype=np.int32),
        completions=completions,
        created_at=time.time(),
        meta={
            "epoch": pending.prompt.epoch,
            "row": pending.prompt.index,
            **failure_meta(scores),
        },
        env=group_stats(pending.trajectories) if pending.trajectories else {},
    )


class Actor:
    """An actor ready to loop: built, it has loaded its task (the parts that fail on bad input,
    before touching Redis), connected to Redis and started its engine and weight subscriber."""

    def __init__(self, cfg: Config, actor_id: str, stop: threading.Event) -> None:
        self.cfg = cfg
        self.actor_id = actor_id
        self.stop = stop
        self.seq = 0
        self.leases: set[str] = set()
        self.tokens_per_s = 0.0
        # one group scored and published at a time, in the order they finished
        self.publishing = asyncio.Lock()

        self.phases = Phases()
        # -- load: everything that can fail on bad input, before touching Redis ----------------
        torch.set_num_threads(cfg.run.torch_threads)
        inputs.prepare(cfg.model, cfg.data, cfg.run.seed)
        self.tokenizer = load_tokenizer(cfg.model.path)
        self.dataset = PromptDataset.from_config(cfg.data, self.tokenizer)
        self.phases.done("task")
        self.rewards = RewardPool(cfg.reward)
        self.phases.done("rewards")
        self.reference: ReferenceScorer | None = None
        if cfg.algo.actors_score_reference:
            self.reference = ReferenceScorer(
                cfg.model, cfg.actor.device, cfg.rollout.temperature, cfg.learner.micro_batch_tokens
            )
        self.model = (
            None
            if cfg.actor.engine == "vllm"
            else load_policy(cfg.model.path, cfg.model.dtype, cfg.actor.device)
        )
        # model.lora.sync adapter: versions are adapters, swapped into the policy wrapped with peft
        self.adapters_only = cfg.model.lora.enabled and cfg.model.lora.sync == "adapter"
        self.weight_targets = None
        if self.model is not None and self.adapters_only:
            self.weight_targets = adapter_targets(wrap(self.model, cfg.model.lora))
        self.phases.done("models")
        config = self.model.config if self.model is not None else None
        self.params = SamplingParams.from_config(
            cfg.rollout, stop_token_ids(self.tokenizer, config)
        )
        self.rollouts: Rollouts | None = None
        if cfg.env.name:
            factory = environment.load(cfg.env.name)
            renderer = Renderer(self.tokenizer, getattr(factory, "tools", ()))
            self.rollouts = Rollouts(cfg.env, factory, renderer, self._assistant_turn)
        self.evaluator: Evaluator | None = None
        # the engine version of the last evaluation this actor considered
        self.evaluated = 0
        if cfg.data.eval_path and cfg.data.eval_every:
            self.evaluator = Evaluator(
                cfg.data, cfg.run, self.tokenizer, self.params, self._assistant_turn
            )

        # -- connect: Redis, the weight subscriber and the engine -------------------------------
        self.redis = connect_async(cfg.broker, cfg.run.dir)
        self.keys = Keys.from_config(cfg)
        self.admission = Admission(
            self.redis, self.keys, Bounds.from_config(cfg), cfg.broker.lease_ttl_s
        )
        self.producer = RolloutProducer(self.redis, self.keys, cfg.broker)
        self.heartbeats = Heartbeats(self.redis, self.keys, cfg.actor.heartbeat_s)
        self.prompts = PromptSource(
            self.dataset, self.redis, self.keys.prompts_cursor, cfg.run.seed
        )
        self.subscriber = None
        transport = transports.get(cfg.weightsync.transport)
        # vLLM over shm: its workers read the published slots themselves (weightsync.vllm_shm_engine)
        # (not adapters: the actor stages those and vLLM loads each as a LoRA adapter)
        vllm_reads_shm = (
            cfg.actor.engine == "vllm" and transport.shared_memory and not self.adapters_only
        )
        if transport.publishes and not vllm_reads_shm:
            self.subscriber = Subscriber.from_config(cfg, self.actor_id, self._weight_template())
        seed = sampling_seed(cfg.run.seed, self.actor_id)
        self.engine: Engine
        if cfg.actor.engine == "vllm":
            self.engine = VLLMEngine.from_config(cfg, weight_source=self.subscriber, seed=seed)
        else:
            self.engine = HFEngine(
                self.model,
                self.tokenizer,
                cfg.actor.batch_slots,
                weight_source=self.subscriber,
                seed=seed,
                weight_targets=self.weight_targets,
            )
        if self.subscriber is not None:
            # receive only once the engine stands: vLLM sizes its KV cache from the free GPU memory
            self.subscriber.start()
        metrics.POLICY_VERSION.set(self.engine.version)
        self.phases.done("connect_engine")
        self.publish_log = (
            JsonlLog(published_path(cfg.run.dir, self.actor_id)) if cfg.actor.publish_log else None
        )

    def _weight_template(self) -> dict:
        """What the subscriber stages into: the hf model's parameters (or its adapters), else the
        checkpoint's (vllm: its parameters' or its adapters' names and shapes)."""
        cfg = self.cfg
        if self.weight_targets is not None:
            return dict(self.weight_targets)
        if self.model is not None:
            return dict(self.model.named_parameters())
        dtype = resolve_dtype(cfg.model.dtype, cfg.actor.device)
        if self.adapters_only:
            return adapter_template(cfg.model.path, cfg.model.lora, dtype, cfg.actor.device)[0]
        return parameter_template(cfg.model.path, cfg.model.dtype, cfg.actor.device)

    # -- the loop ----------------------------------------------------------------------------

    async def run(self) -> None:
        beat = asyncio.create_task(self._heartbeat())
        try:
            if self.cfg.agent.enabled:
                await self._serve_agents()
            while not self.stop.is_set():
                batch = await self._admit()
                if not batch:
                    continue
                await self._generate_score_publish(batch)
                await self._maybe_evaluate()
        finally:
            beat.cancel()
            await asyncio.gather(beat, return_exceptions=True)
            await self._shutdown()

    async def _admit(self) -> list[_Pending]:
        """Wait for fresh-enough weights and one admission lease, then take up to a full engine batch."""
        started = time.monotonic()
        try:
            while not self.stop.is_set():
                learner_version = await self.admission.version()
                self.engine_version_tick(learner_version)
                if not is_stale(learner_version, self.engine.version, self.cfg.algo.max_staleness):
                    # the bound depends on the version of the engine that will generate the group
                    lease = await self.admission.try_start(self.actor_id, self.engine.version)
                    if lease is not None:
                        # at once: a stop from here on must release it
                        self.leases.add(lease)
                        break
                await asyncio.sleep(POLL_S)
            else:
                return []
        finally:
            metrics.ADMISSION_WAIT_SECONDS.inc(time.monotonic() - started)
        batch = [_Pending(lease, await self.prompts.next())]
        groups = max(1, self.cfg.actor.batch_slots // self.cfg.rollout.group_size)
        while len(batch) < groups:
            more = await self._admit_now()
            if more is None:
                break
            batch.append(more)
        return batch

    async def _admit_now(self) -> _Pending | None:
        """One more group if admission grants it at once, and the engine is fresh enough."""
        learner_version = await self.admission.version()
        if is_stale(learner_version, self.engine.version, self.cfg.algo.max_staleness):
            return None
        lease = await self.admission.try_start(self.actor_id, self.engine.version)
        if lease is None:
            return None
        self.leases.add(lease)
        return _Pending(lease, await self.prompts.next())

    def engine_version_tick(self, learner_version: int) -> None:
        """Outside generation the engine is idle: swap in staged weights here too."""
        self.engine.maybe_swap_weights()
        metrics.VERSION_LAG.set(max(0, learner_version - self.engine.version))

    def _requests(self, g: int, pending: _Pending) -> list[Request]:
        return [
            Request(f"{g}:{j}", pending.prompt.token_ids)
            for j in range(self.cfg.rollout.group_size)
        ]

    async def _generate_score_publish(self, batch: list[_Pending]) -> None:
        if self.rollouts is not None:
            await self._roll_out_score_publish(batch)
            return
        group_size = self.cfg.rollout.group_size
        batch = list(batch)
        requests = [r for g, pending in enumerate(batch) for r in self._requests(g, pending)]
        extra = {}
        # groups handed to the publisher while generation goes on (actor.refill)
        published: list = []
        if self.cfg.actor.refill and isinstance(self.engine, HFEngine):
            extra = self._refill_callbacks(batch, published)
        start = time.monotonic()
        outputs = await asyncio.to_thread(
            self.engine.generate, requests, self.params, self.stop.is_set, **extra
        )
        elapsed = time.monotonic() - start
        metrics.GENERATE_SECONDS.inc(elapsed)
        self.tokens_per_s = sum(len(o.token_ids) for o in outputs) / max(elapsed, 1e-9)
        await asyncio.gather(*(asyncio.wrap_future(f) for f in published))
        rest = [p for p in batch if not p.published]
        for g, pending in enumerate(batch):
            if not pending.published:
                pending.outputs = outputs[g * group_size : (g + 1) * group_size]
        complete = [p for p in rest if all(o.finish_reason != "abort" for o in p.outputs)]
        for pending in rest:
            if pending not in complete:
                await self._release(pending.lease_id)
        await self._score_publish(complete)

    def _refill_callbacks(self, batch: list[_Pending], published: list) -> dict:
        """``refill`` and ``on_finished`` for the hf engine, called from its thread: admit groups
        while slots are free, and publish each group once its completions are all done."""
        loop = asyncio.get_running_loop()
        size = self.cfg.rollout.group_size
        finished: dict[int, dict[int, Output]] = {}

        def refill() -> list[Request]:
            if self.stop.is_set():
                return []
            more = asyncio.run_coroutine_threadsafe(self._admit_now(), loop).result()
            if more is None:
                return []
            batch.append(more)
            return self._requests(len(batch) - 1, more)

        def on_finished(index: int, output: Output) -> None:
            g, j = divmod(index, size)
            outputs = finished.setdefault(g, {})
            outputs[j] = output
            if len(outputs) == size:
                pending = batch[g]
                pending.outputs = [outputs[k] for k in range(size)]
                pending.published = True
                published.append(
                    asyncio.run_coroutine_threadsafe(self._score_publish([pending]), loop)
                )

        return {"refill": refill, "on_finished": on_finished}

    async def _score_publish(self, complete: list[_Pending]) -> None:
        """Score the groups whose completions are all done and publish them."""
        if not complete:
            return
        async with self.publishing:
            await self._score_publish_now(complete)

    async def _score_publish_now(self, complete: list[_Pending]) -> None:
        conversational = self.dataset.format == "messages"
        samples = [
            RewardInput(
                p.prompt.messages + [self._assistant_turn(o)],
                p.prompt.answer,
                p.prompt.columns,
                conversational,
                o.token_ids.tolist(),
            )
            for p in complete
            for o in p.outputs
        ]
        scores, _ = await asyncio.gather(
            asyncio.to_thread(self.rewards.score, samples), self._score_reference(complete)
        )
        await self._publish(complete, scores)

    async def _roll_out_score_publish(self, batch: list[_Pending]) -> None:
        """Multi-turn: G trajectories per group through the environment, then scored and published
        like completions (their rewards: the reward functions on the whole conversation plus the
        environment's)."""
        size = self.cfg.rollout.group_size
        started = []
        for pending in batch:
            prompt = pending.prompt
            row = {"messages": prompt.messages, "answer": prompt.answer, **prompt.columns}
            try:
                pending.trajectories = await asyncio.to_thread(self.rollouts.start_group, row, size)
                started.append(pending)
            except environment.EnvFailure as exc:
                log.warning("environment reset failed, group %s dropped: %s", prompt.prompt_id, exc)
                await self._release(pending.lease_id)
        if not started:
            return
        every = [t for p in started for t in p.trajectories]
        start = time.monotonic()
        finished = await asyncio.to_thread(
            self.rollouts.run, self.engine, every, self.params, self.stop.is_set
        )
        elapsed = time.monotonic() - start
        metrics.GENERATE_SECONDS.inc(elapsed)
        self.tokens_per_s = sum(sum(t.mask) for t in every) / max(elapsed, 1e-9)
        if not finished:
            for pending in started:
                await self._release(pending.lease_id)
            return
        for pending in started:
            pending.outputs = [t.output(str(j)) for j, t in enumerate(pending.trajectories)]
        samples = [
            RewardInput(t.messages, p.prompt.answer, p.prompt.columns, True)
            for p in started
            for t in p.trajectories
        ]
        scores, _ = await asyncio.gather(
            asyncio.to_thread(self.rewards.score, samples), self._score_reference(started)
        )
        await self._publish(
            started, [self._with_env(t, s) for t, s in zip(every, scores, strict=True)]
        )

    async def _serve_agents(self) -> None:
        """Serve the OpenAI API (``agent.enabled``) until stopped: agents open groups, their calls
        are generated and recorded, and each closed group is scored and published."""
        server = AgentServer(
            self.cfg,
            self.actor_id,
            self.tokenizer,
            self.engine,
            self.params,
            self._admit_now,
            self._publish_agent_group,
            self._release,
            self.stop.is_set,
        )
        await server.start()
        try:
            while not self.stop.is_set() and server.failed() is None:
                metrics.VERSION_LAG.set(
                    max(0, await self.admission.version() - self.engine.version)
                )
                await asyncio.sleep(POLL_S)
            if server.failed() is not None:
                raise server.failed()
        finally:
            await server.close()

    async def _publish_agent_group(self, group: agent_recorder.AgentGroup) -> bool:
        """Score a group the agents closed (their reported rewards, or the reward functions on the
        recorded conversation) and publish it; False, and its lease released, if it cannot be."""
        pending = group.pending
        try:
            prompt_ids, pending.outputs = agent_recorder.group_outputs(
                group, self.cfg.agent.max_total_tokens
            )
        except ValueError as exc:
            log.warning("agent group %s dropped: %s", group.id, exc)
            await self._release(pending.lease_id)
            return False
        pending.prompt = replace(pending.prompt, token_ids=prompt_ids)
        unscored = [t for t in group.trajectories if t.reward is None]
        samples = [
            RewardInput(
                agent_recorder.Recorder.conversation(t, pending.prompt.messages),
                pending.prompt.answer,
                pending.prompt.columns,
                self.dataset.format == "messages" or t.kind == "chat",
            )
            for t in unscored
        ]
        async with self.publishing:
            scored, _ = await asyncio.gather(
                asyncio.to_thread(self.rewards.score, samples) if samples else _nothing(),
                self._score_reference([pending]),
            )
            by_id = dict(zip((t.id for t in unscored), scored, strict=True))
            scores = [
                by_id[t.id] if t.reward is None else Score(t.reward, {"agent": t.reward})
                for t in group.trajectories
            ]
            try:
                await self._publish([pending], scores)
            # the actor serves on (unlike its own loop, which ends): the lease must not leak
            except Exception:
                log.exception("agent group %s not published", group.id)
                await self._release(pending.lease_id)
                return False
        return True

    def _with_env(self, t: Trajectory, score: Score) -> Score:
        """A trajectory's score: its environment's rewards added (part ``env``), or
        ``env.truncated_reward`` in place of both when it was truncated."""
        if t.truncated and self.cfg.env.truncated_reward is not None:
            return Score(self.cfg.env.truncated_reward, {}, score.failures)
        if not t.env_rewards:
            return score
        env = sum(t.env_rewards)
        return Score(score.total + env, {**score.parts, "env": env}, score.failures)

    async def _publish(self, complete: list[_Pending], scores: list[Score]) -> None:
        group_size = self.cfg.rollout.group_size
        for g, pending in enumerate(complete):
            group_scores = scores[g * group_size : (g + 1) * group_size]
            group = build_group(self.actor_id, self.seq, pending, group_scores)
            entry_id = await self.producer.publish(group, pending.lease_id)
            if self.publish_log is not None:
                self.publish_log.write({"group_id": group.group_id, "entry_id": entry_id})
            self.leases.discard(pending.lease_id)
            self.seq += 1
            self._observe(group)
            if self.seq == 1:
                log.info("actor %s: first group published", self.actor_id)

    async def _score_reference(self, complete: list[_Pending]) -> None:
        """Attach the reference policy's log-probs to each output (while the rewards are scored)."""
        if self.reference is None:
            return
        start = time.monotonic()
        prompts = [p.prompt_token_ids for p in complete for _ in p.outputs]
        completions = [o.token_ids for p in complete for o in p.outputs]
        refs = await asyncio.to_thread(self.reference.logprobs, prompts, completions)
        size = self.cfg.rollout.group_size
        for g, pending in enumerate(complete):
            pending.ref_logprobs = refs[g * size : (g + 1) * size]
        metrics.REFERENCE_SECONDS.inc(time.monotonic() - start)

    async def _maybe_evaluate(self) -> None:
        """Evaluate once per ``eval_every`` versions crossed; one actor per version (SET NX)."""
        every = self.cfg.data.eval_every
        version = self.engine.version
        if self.evaluator is None or version // every <= self.evaluated // every:
            return
        self.evaluated = version
        claim = self.keys.eval_claim(version // every * every)
        if not await self.redis.set(claim, self.actor_id, nx=True):
            return
        row = await asyncio.to_thread(
            self.evaluator.run, self.engine, self.rewards, version, self.stop.is_set
        )
        log.info("eval at version %d: %s", version, row)

    def _assistant_turn(self, output: Output) -> dict:
        return assistant_turn(self.tokenizer, output)

    @staticmethod
    def _observe(group: RolloutGroup) -> None:
        metrics.GROUPS_PUBLISHED.inc()
        metrics.TOKENS_PUBLISHED.inc(sum(len(c) for c in group.completions))
        parts: dict[str, list[float]] = {}
        for c in group.completions:
            metrics.COMPLETION_LENGTH.observe(len(c))
            metrics.REWARD.observe(c.reward)
            for name, value in c.reward_parts.items():
                parts.setdefault(name, []).append(value)
        for name, values in parts.items():
            metrics.REWARD_PART.labels(part=name).set(float(np.mean(values)))

    async def _release(self, lease_id: str) -> None:
        await self.admission.release(lease_id)
        self.leases.discard(lease_id)

    async def _heartbeat(self) -> None:
        while True:
            try:
                await self.heartbeats.beat(self.actor_id, self.engine.version, self.tokens_per_s)
                for lease_id in list(self.leases):
                    await self.admission.renew(lease_id)
            # a Redis hiccup must not kill the actor; the next beat retries
            except Exception as exc:
                log.warning("heartbeat failed: %s", exc)
            await asyncio.sleep(self.cfg.actor.heartbeat_s)

    async def _shutdown(self) -> None:
        for lease_id in list(self.leases):
            await self._release(lease_id)
        await self.heartbeats.forget(self.actor_id)
        if self.subscriber is not None:
            self.subscriber.close()
        self.engine.close()
        self.rewards.close()
        if self.evaluator is not None:
            self.evaluator.close()
        if self.publish_log is not None:
            self.publish_log.close()
        await self.redis.aclose()


async def _nothing() -> list:
    return []


def run_actor(cfg: Config, actor_id: str, stop: threading.Event) -> None:
    """Load, connect, serve metrics, loop until ``stop`` is set, shut down and deregister."""
    # loads (bad input fails here, before Redis), then connects
    actor = Actor(cfg, actor_id, stop)
    endpoint = Endpoint.from_config(cfg)
    port = serve(endpoint, "actor", actor_id, cfg.actor.metrics_port)
    log.info("actor %s started (metrics port %d)", actor_id, port)
    actor.phases.log(log, f"actor {actor_id}")
    pin_assigned(log, f"actor {actor_id}")
    try:
        # returns once ``stop`` is set and the actor has shut down (leases released, engine closed)
        asyncio.run(actor.run())
    finally:
        if port:
            unregister(endpoint, "actor", actor_id, port)
        log.info("actor %s stopped after %d groups", actor_id, actor.seq)
