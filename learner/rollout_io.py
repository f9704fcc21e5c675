"""Rank 0's side of the RL learner outside the math: the rollout stream, admission, weights, acks.

One asyncio loop runs on a thread of its own with one ``redis.asyncio`` client; the learner's
thread hands it the broker's coroutines (``RolloutConsumer``, ``Admission``) and waits for each.
An entry read but not yet trained (dynamic sampling reads past the step) stays on this consumer's
pending list until its step is acked, so a learner that dies before training it gets it back on
restart.

The next batch is not read ahead while a step trains: measured with ``python -m
bench.learner_cost``, reading and preparing a batch is ~3 % of a demo step and a read-ahead hid
about a third of it, within the run-to-run noise; and a read-ahead would check the entries'
versions against a version not yet announced, so a recorded stream replayed on time (the
learner tests' reference runs) would be dead-lettered.

The commit bookkeeping (the consumed count, the entries to ack) is ``learner.commits``'s; this
module carries out its writes to Redis. The step rows, the trackers and the metrics endpoint are
the trainer's (``learner.trainer``).
"""

from __future__ import annotations

import asyncio
import enum
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from streamrl.broker.admission import Admission, Bounds
from streamrl.broker.client import connect_async, connect_sync
from streamrl.broker.keys import Keys
from streamrl.broker.liveness import alive_actors
from streamrl.broker.semantics import Limits
from streamrl.broker.stream import Delivery, RolloutConsumer
from streamrl.configs.schema import AlgoConfig, BrokerConfig, LearnerConfig, LoraConfig, RunConfig
from streamrl.learner import lineage
from streamrl.learner import metrics as m
from streamrl.learner.commits import Commits, StreamProgress
from streamrl.learner.prepare import Batch, dynamic_batch_size, has_signal, prepare_batch
from streamrl.policy.lora import published_tensors
from streamrl.runtime.jsonl_log import JsonlLog, commits_path

if TYPE_CHECKING:
    from streamrl.weightsync.publisher import Publisher

log = logging.getLogger(__name__)

# how often rank 0 counts live actors for streamrl_actors_alive
ALIVE_EVERY_S = 2.0
# other ranks wait in a collective meanwhile; keep it far from the process-group timeout
IDLE_BROADCAST_S = 60.0


class NoBatch(enum.Enum):
    """What ``RolloutIO.next_batch`` returns instead of a batch."""

    # time to stop: a stop was requested or the stream stayed empty past learner.read_timeout_s
    STOP = "stop"
    # nothing yet: lets the other ranks leave their collective and wait in another one
    IDLE = "idle"


class RolloutIO:
    """Everything rank 0 does outside the math: stream, admission, weights, acks."""

    def __init__(
        self,
        run: RunConfig,
        broker: BrokerConfig,
        algo: AlgoConfig,
        learner: LearnerConfig,
        lora: LoraConfig,
        *,
        limits: Limits,
        vocab_size: int,
        reward_names: list[str],
        publisher: Publisher | None = None,
        progress: StreamProgress | None = None,
    ):
        """``limits``: what the stream's entries are checked against; ``reward_names``: how the
        actors name each reward function's failures; ``publisher``: the weights' (None: the
        transport publishes none, the version is announced alone)."""
        self.run_dir = run.dir
        self.broker, self.algo, self.learner, self.lora = broker, algo, learner, lora
        self.progress = progress if progress is not None else StreamProgress()
        # the learner's commit bookkeeping: a Redis wipe seen while reading resets its count
        self.commits = Commits(self.progress, learner.ack_policy, self)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="rollout-io", daemon=True
        )
        self._thread.start()
        self.redis = connect_async(broker, run.dir)
        self.keys = Keys.from_config(run, broker)
        self.consumer = RolloutConsumer(
            self.redis, self.keys, broker, limits, "learner-0", vocab_size
        )
        self.admission = Admission(
            self.redis, self.keys, Bounds.from_config(algo, learner), broker.lease_ttl_s
        )
        # the live-actor count reads heartbeats with the tools' sync helper, on this thread
        self._heartbeats = connect_sync(broker, run.dir)
        self.alive_checked = 0.0
        self.publisher = publisher
        self.reward_names = reward_names
        self.commit_log = JsonlLog(commits_path(Path(run.dir))) if learner.commit_log else None
        self.buffer: list[Delivery] = []
        self.wait_s = 0.0
        self.last_progress = time.monotonic()

    def _run(self, coro):
        """Run a coroutine on the I/O loop and wait for it (bounded by the client's timeouts)."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def resume(self, model) -> None:
        """Pick up from the restored progress: resume the commits (``Commits.resume``), then
        re-announce the version (and its weights)."""
        progress = self.progress
        announced = max(self._run(self.admission.version()), lineage.logged_version(self.run_dir))
        progress.version = lineage.resume_version(progress.version, announced)
        self.commits.resume()
        self._run(self.consumer.start_version_check(progress.version))
        self._run(self.admission.set_version(progress.version))
        m.POLICY_VERSION.set(progress.version)
        if progress.version > 0:
            self.publish(progress.version, model)

    def next_batch(self, version: int, should_stop: Callable[[], bool]) -> Batch | NoBatch:
        """A full batch, or ``NoBatch.STOP``, or ``NoBatch.IDLE`` (nothing yet)."""
        need = self.learner.groups_per_step
        started = time.monotonic()
        if should_stop():
            return NoBatch.STOP
        while (take := self._batch_size(version)) is None:
            if should_stop():
                return NoBatch.STOP
            if time.monotonic() - started > IDLE_BROADCAST_S:
                return NoBatch.IDLE
            t0 = time.monotonic()
            # a short buffer reads up to a batch; a full one still short of signal reads another batch
            count = need - len(self.buffer) if len(self.buffer) < need else need
            held, wipes = len(self.buffer), self.consumer.group_recreated
            got = self._run(self.consumer.read(count, self.broker.block_ms))
            self._recount_after_wipe(wipes, held)
            now = time.monotonic()
            self.wait_s += now - t0
            if got:
                self.buffer += got
                self.last_progress = now
            elif (
                self.learner.read_timeout_s
                and now - self.last_progress > self.learner.read_timeout_s
            ):
                log.warning(
                    "no rollouts for %.0f s (learner.read_timeout_s): stopping",
                    self.learner.read_timeout_s,
                )
                return NoBatch.STOP
        deliveries, self.buffer = self.buffer[:take], self.buffer[take:]
        batch = prepare_batch(deliveries, version, self.algo, self.wait_s, self.reward_names)
        m.STEP_PHASE.labels("wait").observe(self.wait_s)
        self.wait_s = 0.0
        return batch

    def _batch_size(self, version: int) -> int | None:
        """Groups of the buffer that make the next step, or None while more must be read."""
        need, a = self.learner.groups_per_step, self.algo
        if not a.dynamic_sampling:
            return need if len(self.buffer) >= need else None
        cap = a.dynamic_sampling_max_groups or 8 * need
        signal = [has_signal(d.group, version, a) for d in self.buffer[: max(cap, need)]]
        return dynamic_batch_size(signal, need, cap)

    def publish(self, version: int, model, consumed: int | None = None) -> None:
        """Weights first, then the version (with ``consumed``: and the step's count, atomically).

        The learner only stages the weights (one copy); the publisher's background thread writes
        and announces them, then sets the version here, in submission order. Entries of
        ``version`` are admitted from now on: the announcement may reach an actor any moment."""
        t0 = time.perf_counter()
        self.consumer.set_max_version(version)

        def announced() -> None:
            if consumed is None:
                self._run(self.admission.set_version(version))
            else:
                self._run(self.admission.set_consumed(consumed, version))
            m.POLICY_VERSION.set(version)

        if self.publisher is not None:
            self.publisher.submit(version, published_tensors(model, self.lora), then=announced)
        else:
            announced()
        m.STEP_PHASE.labels("publish").observe(time.perf_counter() - t0)

    def flush(self) -> None:
        """Wait until every version submitted is announced with its count: before anything that
        must follow them in Redis (acks, a checkpoint, the end)."""
        if self.publisher is not None:
            self.publisher.flush()

    def set_consumed(self, consumed: int) -> None:
        """Count the groups of completed steps for admission (set only if larger)."""
        self.flush()
        self._run(self.admission.set_consumed(consumed))

    def set_bound(self, bound: int) -> None:
        """The admission bound under ``algo.max_staleness: auto``: actors' next requests enforce it."""
        self._run(self.admission.set_bound(bound))

    def redis_epoch(self) -> str:
        return self._run(self.admission.epoch())

    def consumed_in_redis(self) -> int:
        return self._run(self.admission.counts())["consumed"]

    def _recount_after_wipe(self, wipes_before: int, held: int) -> None:
        """Redis restarted without persistence (the consumer recreated its group) since
        ``wipes_before`` was read, while ``held`` entries read before it were not yet counted."""
        if self.consumer.group_recreated != wipes_before:
            consumed = self.commits.redis_wiped(held, self.redis_epoch())
            self._run(self.admission.reset_consumed(consumed))

    def ack(self, entries: list[tuple[str, str]], consumed: int, step: int) -> None:
        """Commit trained (entry id, group id)s (XACK + XDEL + trained set) with the consumed
        count, and log them under ``step``."""
        self.flush()
        wipes = self.consumer.group_recreated
        groups = [g for _, g in entries]
        self._run(self.consumer.ack([e for e, _ in entries], groups, consumed=consumed))
        self._recount_after_wipe(wipes, len(self.buffer))
        if self.commit_log is not None:
            self.commit_log.write({"step": step, "groups": groups})

    def watch_actors(self) -> None:
        """Count the live actors for ``streamrl_actors_alive`` (at most every ``ALIVE_EVERY_S``)."""
        if time.monotonic() - self.alive_checked > ALIVE_EVERY_S:
            self.alive_checked = time.monotonic()
            m.ACTORS_ALIVE.set(len(alive_actors(self._heartbeats, self.keys)))

    def close(self) -> None:
        """Release weights, the commit log and Redis (once). Entries read and not trained stay
        pending: the next learner gets them again."""
        if self._loop.is_closed():
            return
        if self.publisher is not None:
            # the last versions are announced before Redis goes
            self.publisher.close()
        if self.commit_log is not None:
            self.commit_log.close()
        self._heartbeats.close()
        self._run(self.redis.aclose())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()
