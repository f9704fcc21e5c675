"""One actor process: admit -> roll out -> score -> publish, until stopped.

``run_actor`` is the story: build the actor (``build_actor``: load what fails on bad input
before touching Redis, then connect and start the engine with its weights), serve metrics, run
the loop, shut down. The loop itself (``Actor.run``) is four steps:

- **admit** (``actors.admit``): a lease from the broker's admission control, while the engine's
  weights are fresh enough, and the next prompt;
- **roll out** (``actors.sources``): the source the config chose (dataset prompts, an
  environment's trajectories, or agents' calls) has the engine (``actors.engines``) generate;
- **score** (``actors.scoring``): the reward functions in worker processes, and the reference
  policy's log-probs;
- **publish** (``actors.publish``): one stream entry per group, its lease handed over.

Generation and reward scoring are blocking, so they run in worker threads while the event loop
keeps the heartbeat and the admission leases alive. With no learner the version stays 0 and the
actor stops at the admission bound, which is the intended behaviour. SIGTERM aborts the groups
in flight (their leases are released, not published) and deregisters; a SIGKILLed actor's leases
and heartbeat expire.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import zlib

import torch

from streamrl.actors import engines, inputs, sources
from streamrl.actors.admit import Admit
from streamrl.actors.engines.base import EngineParts, SamplingParams
from streamrl.actors.evaluation import EvalClaims, Evaluator
from streamrl.actors.group import Group
from streamrl.actors.prompt_data import PromptCursor, PromptDataset
from streamrl.actors.publish import Outbox
from streamrl.actors.reference import ReferenceScorer
from streamrl.actors.rewards import RewardPool
from streamrl.actors.scoring import Scorer
from streamrl.actors.sources import Generation, Source
from streamrl.broker.admission import Admission, Bounds
from streamrl.broker.client import connect_async
from streamrl.broker.keys import Keys
from streamrl.broker.liveness import Heartbeats
from streamrl.broker.stream import RolloutProducer
from streamrl.configs.schema import Config
from streamrl.policy.load import load_tokenizer, stop_token_ids
from streamrl.policy.logprobs import Sampling
from streamrl.runtime.cpu_pinning import pin_assigned
from streamrl.runtime.jsonl_log import JsonlLog, published_path
from streamrl.runtime.metrics_endpoint import Endpoint, serve, unregister
from streamrl.runtime.startup_phases import Phases
from streamrl.weightsync.feed import WeightFeed

log = logging.getLogger(__name__)


def sampling_seed(run_seed: int, actor_id: str) -> int:
    """The seed of an actor's engine: the same in every process for the same run seed and actor id
    (``zlib.crc32``, not ``hash()``, which Python salts per process), different for other ids.

    Below 2**32: vLLM seeds numpy with it, which refuses larger seeds."""
    return (run_seed * 1_000_003 + zlib.crc32(actor_id.encode())) % (1 << 32)


class Actor:
    """An actor ready to loop: its source, scorer and outbox, and the admission they share."""

    def __init__(
        self,
        gen: Generation,
        source: Source,
        admit: Admit,
        scorer: Scorer,
        outbox: Outbox,
        heartbeats: Heartbeats,
        phases: Phases,
        evaluator: Evaluator | None = None,
    ) -> None:
        self.gen = gen
        self.source = source
        self.admit = admit
        self.scorer = scorer
        self.outbox = outbox
        self.heartbeats = heartbeats
        self.phases = phases
        # runs while admission waits (``Admit.idle``); closed here
        self.evaluator = evaluator

    async def run(self) -> None:
        """Admit, roll out, score and publish until stopped; then release and deregister."""
        beat = asyncio.create_task(self._heartbeat())
        try:
            async with contextlib.aclosing(self.source.groups(self.admit)) as rolled_out:
                async for group in rolled_out:
                    await self._score_and_publish(group)
        finally:
            beat.cancel()
            await asyncio.gather(beat, return_exceptions=True)
            await self._shutdown()

    async def _score_and_publish(self, group: Group) -> None:
        try:
            await self.outbox.publish(group, await self.scorer.score(group))
        except Exception:
            await self.admit.release(group.lease_id)
            group.settle(False)
            if not self.source.serves_on:
                raise
            log.exception("group of %s not published, dropped", group.prompt.prompt_id)
            return
        self.admit.published(group.lease_id)
        group.settle(True)

    async def _heartbeat(self) -> None:
        while True:
            try:
                engine = self.gen.engine
                await self.heartbeats.beat(
                    self.gen.actor_id,
                    engine.version,
                    self.gen.tokens_per_s,
                    weights_from=engine.weights_from,
                )
                await self.admit.renew()
            # a Redis hiccup must not kill the actor; the next beat retries
            except Exception as exc:
                log.warning("heartbeat failed: %s", exc)
            await asyncio.sleep(self.heartbeats.heartbeat_s)

    async def _shutdown(self) -> None:
        await self.admit.release_all()
        await self.heartbeats.forget(self.gen.actor_id)
        self.source.close()
        self.gen.engine.close()
        self.scorer.close()
        self.outbox.close()
        if self.evaluator is not None:
            self.evaluator.close()
        await self.heartbeats.redis.aclose()


def build_actor(cfg: Config, actor_id: str, stop: threading.Event) -> Actor:
    """The actor of ``cfg``: its task loaded (what fails on bad input, before Redis), then Redis,
    the engine with its weights, and the source the config chose."""
    phases = Phases()
    torch.set_num_threads(cfg.run.torch_threads)
    inputs.check(cfg.model, cfg.data)
    tokenizer = load_tokenizer(cfg.model.path)
    template_kwargs = cfg.rollout.chat_template_kwargs
    dataset = PromptDataset.from_config(cfg.data, tokenizer, template_kwargs=template_kwargs)
    phases.done("task")
    rewards = RewardPool(cfg.reward)
    reference = None
    if cfg.algo.actors_score_reference:
        reference = ReferenceScorer(
            cfg.model.path,
            cfg.model.dtype,
            cfg.actor.device,
            Sampling(cfg.rollout.temperature, cfg.rollout.top_k, cfg.rollout.top_p),
            cfg.learner.micro_batch_tokens,
        )
    phases.done("rewards")

    redis = connect_async(cfg.broker, cfg.run.dir)
    keys = Keys.from_config(cfg.run, cfg.broker)
    feed = WeightFeed.from_config(cfg.weightsync, cfg.broker, cfg.run, actor_id)
    engine_type = engines.get(cfg.actor.engine)
    parts = EngineParts(feed, tokenizer, sampling_seed(cfg.run.seed, actor_id))
    engine = engine_type.from_config(parts, **cfg.sections_for(engine_type.from_config))
    phases.done("engine")

    params = SamplingParams.from_config(cfg.rollout, stop_token_ids(tokenizer, cfg.model.path))
    gen = Generation(engine, actor_id, params, tokenizer, cfg.rollout.group_size, template_kwargs)
    source_type = sources.get(cfg.rollout_source)
    source = source_type.from_config(gen, **cfg.sections_for(source_type.from_config))
    evaluator = None
    if cfg.data.eval_path and cfg.data.eval_every:
        evaluator = Evaluator(
            PromptDataset.from_config(
                cfg.data, tokenizer, held_out=True, template_kwargs=template_kwargs
            ),
            size=cfg.data.eval_size,
            every=cfg.data.eval_every,
            run_dir=cfg.run.dir,
            tensorboard="tensorboard" in cfg.run.report_to,
            gen=gen,
            rewards=rewards,
            claims=EvalClaims(redis, keys, actor_id),
            should_abort=stop.is_set,
        )
    admission = Admission(
        redis, keys, Bounds.from_config(cfg.algo, cfg.learner), cfg.broker.lease_ttl_s
    )
    cursor = PromptCursor(dataset, redis, keys.prompts_cursor, cfg.run.seed)
    admit = Admit(
        admission,
        cursor,
        engine,
        actor_id,
        stop,
        idle=evaluator.maybe_run if evaluator is not None else None,
    )
    publish_log = None
    if cfg.actor.publish_log:
        publish_log = JsonlLog(published_path(cfg.run.dir, actor_id))
    outbox = Outbox(RolloutProducer(redis, keys, cfg.broker), actor_id, publish_log)
    heartbeats = Heartbeats(redis, keys, cfg.actor.heartbeat_s, cfg.run.host_id)
    phases.done("connect")
    scorer = Scorer(rewards, reference)
    return Actor(gen, source, admit, scorer, outbox, heartbeats, phases, evaluator)


def run_actor(cfg: Config, actor_id: str, stop: threading.Event) -> None:
    """Build, serve metrics, loop until ``stop`` is set, shut down and deregister."""
    actor = build_actor(cfg, actor_id, stop)
    endpoint = Endpoint.from_config(cfg.metrics, cfg.broker, cfg.run)
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
        log.info("actor %s stopped after %d groups", actor_id, actor.outbox.seq)
