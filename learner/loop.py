"""The learner loop: read a batch, train it on every rank, publish, commit.

Rank 0 alone talks to Redis: it reads ``groups_per_step`` entries through the
RolloutConsumer, drops fully stale groups and zero-variance groups (counted),
computes advantages, and broadcasts the batch to the other ranks
(``broadcast_object_list`` over the gloo/NCCL group; the batch is small next to
the model). All ranks train the same batch on balanced shares, so their
weights stay identical. Rank 0 then publishes each new version, sets it in
Redis, and commits the entries. Every completed step, trained or not, adds its
entries to ``Progress.consumed`` and writes that running total to
``adm:consumed`` (set only if larger: idempotent, restored from the checkpoint
by a restarted learner, see broker.admission).

Ack policy (``learner.ack_policy``):
- ``checkpoint`` (default): entries are acked only after a checkpoint holds
  the step that used them. The checkpoint also lists them, and a restarted
  learner acks that list first (a crash between save and ack). A SIGKILLed
  learner restarts from the checkpoint and re-reads exactly the entries of the
  lost steps from its pending list, in the same order: nothing lost, nothing
  trained twice, the same weights as an uninterrupted run.
- ``step``: entries are acked as soon as their step is published. Less
  redelivery after a crash, but the steps since the last checkpoint are lost
  together with their data.
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from broker.audit import JsonlLog, commits_path
from configs.schema import Config
from learner import algorithm, checkpoint, lineage, target
from learner import metrics as m
from learner.batching import Sample, samples_from_group
from learner.engine import build_engine, device, init_distributed
from learner.export import export_at_end
from learner.step import UpdateStats, first_pass_tokens, train_batch
from learner.tracking import Tracker

log = logging.getLogger(__name__)

ALIVE_EVERY_S = 2.0  # how often rank 0 counts live actors for streamrl_actors_alive

EXACT_TOLERANCE = 1e-6
IDLE_BROADCAST_S = (
    60.0  # other ranks wait in a collective; keep it far from the process-group timeout
)


@dataclass
class Progress:
    """What a checkpoint must restore besides weights and optimizer."""

    step: int = 0
    version: int = 0
    samples: int = 0
    tokens: int = 0
    # groups taken by completed steps (admission); below zero right after a Redis wipe, by the
    # entries held from before it (the wiped `accepted` no longer counts them)
    consumed: int = 0
    # admission.epoch of the Redis data set `consumed` counts in
    redis_epoch: str = ""
    unacked: list[tuple[str, str]] = field(
        default_factory=list
    )  # (entry id, group id) trained, not acked

    @classmethod
    def from_state(cls, state: dict | None) -> Progress:
        if not state or "progress" not in state:
            return cls()
        p = {"consumed": 0, **state["progress"]}
        p["unacked"] = [tuple(e) for e in p["unacked"]]
        return cls(**p)


@dataclass
class Batch:
    """One step's data as rank 0 prepared it (broadcast to every rank)."""

    version: int
    samples: list[Sample]
    entries: list[tuple[str, str]]  # every entry taken off the stream for this step
    log: dict
    # zero-variance groups' samples: not trained (their advantage is 0 and no KL or entropy term
    # is on) but counted by the loss normaliser, so skipping them saves compute without changing
    # the objective
    skipped: list[Sample] = field(default_factory=list)


def _exact(completion) -> bool:
    if "exact" in completion.reward_parts:
        return completion.reward_parts["exact"] >= 1.0 - EXACT_TOLERANCE
    return completion.reward >= 1.0 - EXACT_TOLERANCE


def _group_staleness(group, version: int) -> list[np.ndarray]:
    return [
        algorithm.token_staleness(version, c.versions.astype(np.int64)) for c in group.completions
    ]


def _wholly_stale(group_staleness: list[np.ndarray], max_staleness: int) -> bool:
    return all(bool((s > max_staleness).all()) for s in group_staleness)


def has_signal(group, version: int, cfg: Config) -> bool:
    """Whether a group would be trained: not wholly stale and its rewards not all equal."""
    if _wholly_stale(_group_staleness(group, version), cfg.algo.max_staleness):
        return False
    rewards = group.rewards
    return bool(np.max(rewards) != np.min(rewards))


def dynamic_batch_size(signal: list[bool], need: int, cap: int) -> int | None:
    """How many of the buffered groups (``signal``: which carry one, in stream order) make the step.

    The shortest prefix holding ``need`` groups with a signal, or ``cap`` groups when
    none shorter does; None while the buffer is too short for either.
    """
    cap = max(cap, need)
    found = 0
    for i, s in enumerate(signal[:cap]):
        found += s
        if found == need:
            return i + 1
    return cap if len(signal) >= cap else None


def prepare_batch(deliveries, version: int, cfg: Config, wait_s: float) -> Batch:
    """Drop fully stale and zero-variance groups (counted), attach group advantages.

    Under dynamic sampling the dropped zero-variance groups are not kept for the loss
    normaliser either: the batch is the groups with a signal, as DAPO defines it.
    """
    a = cfg.algo
    samples: list[Sample] = []
    skipped: list[Sample] = []
    rewards, exact, staleness = [], [], []
    parts: dict[str, list[float]] = {}
    by_actor: dict[str, int] = {}
    spanning = 0
    dropped_stale = zero_variance = 0
    for d in deliveries:
        g = d.group
        group_staleness = _group_staleness(g, version)
        if _wholly_stale(group_staleness, a.max_staleness):
            dropped_stale += 1
            m.DROPPED_STALE_TOKENS.inc(sum(s.size for s in group_staleness))
            continue
        rewards += [c.reward for c in g.completions]
        for c in g.completions:
            for part, value in c.reward_parts.items():
                parts.setdefault(part, []).append(value)
        exact += [_exact(c) for c in g.completions]
        by_actor[g.actor_id] = by_actor.get(g.actor_id, 0) + 1
        # completions that saw a weight swap between two of their tokens
        spanning += sum(int(c.versions[0] != c.versions[-1]) for c in g.completions)
        advantages, zero_var = algorithm.group_advantages(
            torch.tensor(g.rewards)[None], a.advantage, a.adv_eps, a.std_threshold
        )
        # with a KL or entropy term a zero-advantage token still has a gradient: skipping it
        # would change the objective, so only dynamic sampling (DAPO's batch definition) drops it
        skippable = a.skip_zero_variance and a.kl_coef == 0 and a.entropy_coef == 0
        if (skippable or a.dynamic_sampling) and bool(zero_var[0]):
            zero_variance += 1
            if not a.dynamic_sampling:
                skipped += samples_from_group(g, advantages[0].tolist())
            continue
        samples += samples_from_group(g, advantages[0].tolist())
        staleness += group_staleness
    all_staleness = np.concatenate(staleness) if staleness else np.zeros(0, dtype=np.int64)
    stale_tokens = int((all_staleness > a.max_staleness).sum())
    m.DROPPED_STALE_TOKENS.inc(stale_tokens)
    m.DROPPED_STALE_GROUPS.inc(dropped_stale)
    m.ZERO_VARIANCE_GROUPS.inc(zero_variance)
    m.observe_staleness(all_staleness)
    adv_abs = float(np.mean([abs(s.advantage) for s in samples])) if samples else 0.0
    m.ADVANTAGE_ABS_MEAN.set(adv_abs)
    for r in rewards:
        m.REWARD.observe(r)
    return Batch(
        version=version,
        samples=samples,
        entries=[(d.entry_id, d.group.group_id) for d in deliveries],
        log={
            "groups": len(deliveries),
            "reward_mean": float(np.mean(rewards)) if rewards else math.nan,
            "exact_match": float(np.mean(exact)) if exact else math.nan,
            "staleness_mean": float(all_staleness.mean()) if all_staleness.size else 0.0,
            "staleness_max": int(all_staleness.max()) if all_staleness.size else 0,
            # masked out of the loss: older than max_staleness (wholly stale groups not included)
            "stale_tokens": stale_tokens,
            "dropped_stale_groups": dropped_stale,
            "zero_variance_groups": zero_variance,
            "advantage_abs_mean": adv_abs,
            "wait_s": wait_s,
            "groups_by_actor": by_actor,
            "version_spanning_completions": spanning,
            "reward_parts": {name: float(np.mean(v)) for name, v in parts.items()},
        },
        skipped=skipped,
    )


class RankZeroIO:
    """Everything rank 0 does outside the math: stream, admission, weights, metrics, step log."""

    def __init__(self, cfg: Config, vocab_size: int, progress: Progress | None = None):
        from broker import metrics as broker_metrics
        from broker.admission import Admission
        from broker.liveness import Heartbeats
        from broker.stream import Blocking, RolloutConsumer

        self.cfg = cfg
        # the learner's own progress: a Redis wipe seen while reading resets its consumed count
        self.progress = progress if progress is not None else Progress()
        self.consumer = Blocking(cfg, lambda r: RolloutConsumer(r, cfg, "learner-0", vocab_size))
        self.admission = Blocking(cfg, lambda r: Admission(r, cfg))
        self.heartbeats = Blocking(cfg, lambda r: Heartbeats(r, cfg))
        self.alive_checked = 0.0
        self.publisher = None
        if cfg.weightsync.transport != "none":
            from weightsync import make_publisher

            self.publisher = make_publisher(cfg)
        self.metrics_port = broker_metrics.serve(cfg, "learner", "0", cfg.learner.metrics_port)
        run_dir = Path(cfg.run.dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        self.steps_log = JsonlLog(run_dir / "learner_steps.jsonl")
        self.tracker = Tracker(cfg)
        self.commit_log = JsonlLog(commits_path(run_dir)) if cfg.learner.commit_log else None
        self.buffer = []
        self.wait_s = 0.0
        self.last_progress = time.monotonic()

    def resume(self, progress: Progress, model) -> None:
        """Ack what the checkpoint covers (a crash may have hit between save and ack); re-announce
        the version and the consumed count.

        With ``ack_policy: step`` the steps after the checkpoint are lost with their entries
        (acked and deleted), so Redis's count, which holds them, is the right one. With
        ``checkpoint`` those entries come back and are counted again as their steps are redone.
        """
        announced = max(self.admission.version(), lineage.logged_version(self.cfg.run.dir))
        progress.version = lineage.resume_version(progress.version, announced)
        # Redis lost its data since the checkpoint: its count is of groups the new `accepted` lacks
        epoch = self.admission.epoch()
        if progress.redis_epoch not in ("", epoch):
            progress.consumed = 0
        progress.redis_epoch = epoch
        if self.cfg.learner.ack_policy == "step":
            progress.consumed = max(progress.consumed, self.admission.counts()["consumed"])
        self.ack(progress)
        self.admission.set_consumed(progress.consumed)
        self.consumer.start_version_check(progress.version)
        self.admission.set_version(progress.version)
        m.POLICY_VERSION.set(progress.version)
        if progress.version > 0:
            self.publish(progress.version, model)

    def next_batch(self, version: int, should_stop: Callable[[], bool]) -> Batch | str:
        """A full batch, or ``"stop"``, or ``"idle"`` (nothing yet; lets the other ranks leave their collective)."""
        cfg = self.cfg
        need = cfg.learner.groups_per_step
        started = time.monotonic()
        if should_stop():
            return "stop"
        while (take := self._batch_size(version)) is None:
            if should_stop():
                return "stop"
            if time.monotonic() - started > IDLE_BROADCAST_S:
                return "idle"
            t0 = time.monotonic()
            # a short buffer reads up to a batch; a full one still short of signal reads another batch
            count = need - len(self.buffer) if len(self.buffer) < need else need
            held, wipes = len(self.buffer), self.consumer.group_recreated
            got = self.consumer.read(count, cfg.broker.block_ms)
            self._recount_after_wipe(wipes, held)
            now = time.monotonic()
            self.wait_s += now - t0
            if got:
                self.buffer += got
                self.last_progress = now
            elif (
                cfg.learner.read_timeout_s and now - self.last_progress > cfg.learner.read_timeout_s
            ):
                log.warning(
                    "no rollouts for %.0f s (learner.read_timeout_s): stopping",
                    cfg.learner.read_timeout_s,
                )
                return "stop"
        deliveries, self.buffer = self.buffer[:take], self.buffer[take:]
        batch = prepare_batch(deliveries, version, cfg, self.wait_s)
        m.STEP_PHASE.labels("wait").observe(self.wait_s)
        self.wait_s = 0.0
        return batch

    def _batch_size(self, version: int) -> int | None:
        """Groups of the buffer that make the next step, or None while more must be read."""
        need, a = self.cfg.learner.groups_per_step, self.cfg.algo
        if not a.dynamic_sampling:
            return need if len(self.buffer) >= need else None
        cap = a.dynamic_sampling_max_groups or 8 * need
        signal = [has_signal(d.group, version, self.cfg) for d in self.buffer[: max(cap, need)]]
        return dynamic_batch_size(signal, need, cap)

    def publish(self, version: int, model, consumed: int | None = None) -> None:
        """Weights first, then the version (with ``consumed``: and the step's count, atomically)."""
        t0 = time.perf_counter()
        if self.publisher is not None:
            self.publisher.publish(version, {n: p.detach() for n, p in model.named_parameters()})
        self.consumer.set_max_version(version)
        if consumed is None:
            self.admission.set_version(version)
        else:
            self.admission.set_consumed(consumed, version)
        m.POLICY_VERSION.set(version)
        m.STEP_PHASE.labels("publish").observe(time.perf_counter() - t0)

    def _recount_after_wipe(self, wipes_before: int, held: int) -> None:
        """Redis restarted without persistence (the consumer recreated its group): the counters
        start from zero, and the ``held`` entries we read before the wipe, which its ``accepted``
        no longer counts, are counted below zero until their step completes."""
        if self.consumer.group_recreated != wipes_before:
            self.progress.consumed = -held
            self.progress.redis_epoch = self.admission.epoch()
            self.admission.reset_consumed(self.progress.consumed)

    def ack(self, progress: Progress) -> None:
        if progress.unacked:
            wipes = self.consumer.group_recreated
            self.consumer.ack(
                [e for e, _ in progress.unacked],
                [g for _, g in progress.unacked],
                consumed=progress.consumed,
            )
            self._recount_after_wipe(wipes, len(self.buffer))
            if self.commit_log is not None:
                groups = [g for _, g in progress.unacked]
                self.commit_log.write({"step": progress.step, "groups": groups})
            progress.unacked = []

    def record(
        self, progress: Progress, batch: Batch, updates: list[UpdateStats], step_s: float
    ) -> dict:
        last = updates[-1] if updates else None
        row = {
            "step": progress.step,
            "version": progress.version,
            # False for a batch whose every group was dropped (stale or zero-variance): no update
            "trained": bool(updates),
            **batch.log,
            "samples": len(batch.samples),
            "tokens": first_pass_tokens(updates),
            "loss": last.loss if last else math.nan,
            "clip_fraction": last.clip_fraction if last else math.nan,
            "is_weight_mean": last.is_weight_mean if last else math.nan,
            "is_truncated_fraction": last.is_truncated_fraction if last else math.nan,
            "kl": last.kl if last else math.nan,
            "entropy": last.entropy if last else math.nan,
            "grad_norm": last.grad_norm if last else math.nan,
            "step_s": step_s,
            "time": time.time(),
        }
        self.steps_log.write(row)
        self.tracker.log(row, batch)
        if time.monotonic() - self.alive_checked > ALIVE_EVERY_S:
            self.alive_checked = time.monotonic()
            m.ACTORS_ALIVE.set(len(self.heartbeats.alive()))
        if last:
            m.LOSS.set(last.loss)
            m.CLIP_FRACTION.set(last.clip_fraction)
            m.IS_WEIGHT_MEAN.set(last.is_weight_mean)
            m.IS_TRUNCATED.set(last.is_truncated_fraction)
            m.KL.set(last.kl)
            m.ENTROPY.set(last.entropy)
            m.GRAD_NORM.set(last.grad_norm)
            for u in updates:
                m.STEP_PHASE.labels("forward_backward").observe(u.forward_backward_s)
                m.STEP_PHASE.labels("optimizer").observe(u.optimizer_s)
        return row

    def close(self) -> None:
        from broker import metrics as broker_metrics

        if self.publisher is not None:
            self.publisher.close()
        if self.metrics_port:
            broker_metrics.unregister(self.cfg, "learner", "0", self.metrics_port)
        self.steps_log.close()
        self.tracker.close()
        if self.commit_log is not None:
            self.commit_log.close()
        self.consumer.close()
        self.admission.close()
        self.heartbeats.close()


def _broadcast(obj, rank: int, world: int):
    if world == 1:
        return obj
    box = [obj if rank == 0 else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _format(row: dict) -> str:
    return (
        f"step {row['step']:5d} v{row['version']:<5d} reward {row['reward_mean']:.3f} exact {row['exact_match']:.3f} "
        f"loss {row['loss']:+.4f} tokens {row['tokens']:6d} stale {row['staleness_mean']:.2f} "
        f"wait {row['wait_s']:.2f}s step {row['step_s']:.2f}s"
    )


class Learner:
    """The learner of one rank: engine, resumed progress, and (rank 0) the Redis side.

    ``python -m learner`` calls ``run``; tests drive ``train_next`` step by step.
    """

    def __init__(self, cfg: Config, should_stop: Callable[[], bool] = lambda: False):
        from weightsync.policy import load_policy

        self.cfg = cfg
        self.started = time.monotonic()
        self.should_stop = should_stop
        self.rank, self.world = init_distributed()
        model = load_policy(cfg.model.path, cfg.model.dtype, str(device()))
        self.pad_id = model.config.pad_token_id if model.config.pad_token_id is not None else 0
        self.engine = build_engine(cfg, model, self.world)
        self.ref_model = (
            load_policy(cfg.model.path, cfg.model.dtype, str(device()))
            if cfg.algo.kl_coef > 0
            else None
        )
        self.ckpt_root = Path(cfg.run.dir) / "checkpoints"
        self.progress = Progress.from_state(checkpoint.load(self.engine, self.ckpt_root, self.rank))
        self.last_ckpt_step = self.progress.step
        # (reward, exact match) of the recent step records, for cfg.run.target_* (rank 0 decides the stop)
        self.recent: deque[tuple[float, float]] = deque(maxlen=cfg.run.target_window)
        self.io = (
            RankZeroIO(cfg, model.config.vocab_size, self.progress) if self.rank == 0 else None
        )
        if self.io is not None:
            self.io.resume(self.progress, self.engine.module)

    @property
    def model(self) -> torch.nn.Module:
        return self.engine.module

    def stop_requested(self) -> bool:
        cfg = self.cfg
        done = bool(cfg.run.max_steps) and self.progress.step >= cfg.run.max_steps
        late = bool(cfg.run.max_time_s) and time.monotonic() - self.started > cfg.run.max_time_s
        return done or late or self.target_reached() or self.should_stop()

    def target_reached(self) -> bool:
        r = self.cfg.run
        if not target.enabled(r.target_reward, r.target_exact):
            return False
        rewards, exacts = [x for x, _ in self.recent], [e for _, e in self.recent]
        return target.window_reached(
            rewards, exacts, r.target_reward, r.target_exact, r.target_window
        )

    def train_next(self) -> dict | None:
        """Take the next batch and train it. Returns rank 0's step record ({} elsewhere; with
        ``trained`` false when every group of the batch was dropped), or None when it is time to stop."""
        while True:
            batch = (
                self.io.next_batch(self.progress.version, self.stop_requested) if self.io else None
            )
            batch = _broadcast(batch, self.rank, self.world)
            if batch == "stop":
                return None
            if batch != "idle":
                return self._train(batch)

    def _train(self, batch: Batch) -> dict:
        cfg, progress, io = self.cfg, self.progress, self.io
        t0 = time.perf_counter()
        updates = []
        taken = len(batch.entries)
        if batch.samples:

            def after_update(_stats: UpdateStats) -> None:
                progress.version += 1
                if io is None:
                    return
                if progress.version - batch.version < cfg.learner.versions_per_batch:
                    io.publish(progress.version, self.engine.module)
                else:
                    # the batch's last update completes the step: its groups count with its version
                    io.publish(progress.version, self.engine.module, progress.consumed + taken)

            updates = train_batch(
                self.engine,
                batch.samples,
                batch.version,
                cfg,
                self.rank,
                self.world,
                self.pad_id,
                self.ref_model,
                after_update,
                skipped=batch.skipped,
            )
            progress.step += 1
            progress.samples += len(batch.samples)
            progress.tokens += first_pass_tokens(updates)
        progress.unacked += batch.entries
        # counted trained or not: a step whose every group was dropped still frees their slots
        progress.consumed += taken
        if cfg.learner.ack_policy == "step":
            if io is not None:
                io.ack(progress)
            progress.unacked = []
        elif io is not None and not updates:
            io.admission.set_consumed(progress.consumed)
        row: dict = {}
        if io is not None:
            if updates:
                m.STEPS.inc()
                m.SAMPLES.inc(len(batch.samples))
                m.TOKENS.inc(first_pass_tokens(updates))
            row = io.record(progress, batch, updates, time.perf_counter() - t0)
            if updates:
                self.recent.append((row["reward_mean"], row["exact_match"]))
        if updates and progress.step % cfg.learner.checkpoint_every == 0:
            self.save_checkpoint()
        return row

    def save_checkpoint(self) -> None:
        """Collective. With ``ack_policy: checkpoint`` the entries it covers are acked right after."""
        t0 = time.perf_counter()
        state = {"progress": asdict(self.progress)}
        checkpoint.save(self.engine, self.ckpt_root, self.progress.step, state, self.rank)
        self.last_ckpt_step = self.progress.step
        if self.io is not None:
            m.STEP_PHASE.labels("checkpoint").observe(time.perf_counter() - t0)
            if self.cfg.learner.ack_policy == "checkpoint":
                self.io.ack(self.progress)
        self.progress.unacked = []

    def close(self) -> None:
        """Checkpoint what is not yet saved, export the policy (rank 0), then release Redis, weights, metrics."""
        try:
            if self.progress.step > self.last_ckpt_step or self.progress.unacked:
                self.save_checkpoint()
            if self.io is not None:
                export_at_end(self.cfg, self.model, self.progress.step, self.progress.version)
        finally:
            if self.io is not None:
                self.io.close()

    def run(self, echo: Callable[[str], None] = print) -> Progress:
        """Train until run.max_steps / run.max_time_s / the run.target_* / ``should_stop()`` / the read timeout."""
        try:
            while (row := self.train_next()) is not None:
                if row:
                    echo(_format(row))
            if self.target_reached():
                r = self.cfg.run
                echo(
                    f"target reached: {r.target_window}-step means of reward >= {r.target_reward} "
                    f"and exact match >= {r.target_exact} at step {self.progress.step}"
                )
        finally:
            self.close()
        return self.progress
