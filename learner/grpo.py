"""The RL objective (GRPO family): read a batch, train it on every rank, publish, checkpoint, ack.

One step, as ``GRPO.train_next`` drives it::

    batch = io.next_batch(version)     # rank 0: stream -> drop stale / zero-variance -> advantages
    batch = broadcast(batch)           # every rank trains the same batch on its balanced share
    train_batch(engine, batch, ...)    # learner.step: the loss of learner.algorithm, optimizer steps
      after each update: io.publish    # rank 0: stage the weights (one copy); a background thread
                                       #   writes them, then announces the version and admission's count
    commits.step_done(entries)         # count the step's groups for admission (ack_policy step: ack)
    record_step(row)                   # rank 0: max_staleness: auto's bound; step log, trackers, metrics
    every checkpoint_every steps: save_checkpoint, then commits.checkpointed (ack the entries)

Rank 0 alone talks to Redis, through ``learner.rollout_io``; the batch is small next to the model,
so ``broadcast_object_list`` over the gloo/NCCL group carries it to the other ranks, and their
weights stay identical. The engine, checkpoints, export, step log, trackers and metrics endpoint
are the trainer's (``learner.trainer``).

A stop (SIGTERM through ``should_stop``) is honoured between steps only, and ``close`` saves a
checkpoint only at a step boundary: a step cut short by an error leaves its weights unsaved, and
its entries pending for the next learner. The commit bookkeeping (the consumed count; when entries are acked,
``learner.ack_policy``) is ``learner.commits``'s.
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import Callable

import torch.distributed as dist

from streamrl.broker.semantics import Limits
from streamrl.configs.schema import Config
from streamrl.learner import metrics as m
from streamrl.learner import staleness_control, target
from streamrl.learner.commits import Commits, StreamProgress
from streamrl.learner.prepare import Batch
from streamrl.learner.rollout_io import NoBatch, RolloutIO
from streamrl.learner.step import UpdateStats, first_pass_tokens, off_policy, train_batch
from streamrl.learner.throughput import Throughput
from streamrl.learner.trainer import Trainer
from streamrl.runtime.cpu_pinning import pin_assigned
from streamrl.weightsync import transports

log = logging.getLogger(__name__)


def rollout_io(cfg: Config, vocab_size: int, progress: StreamProgress | None = None) -> RolloutIO:
    """Rank 0's Redis side of the learner of ``cfg``: stream, admission, weights, acks."""
    publisher = None
    if transports.get(cfg.weightsync.transport).publishes:
        from streamrl.weightsync.publisher import Publisher, transfer_dtype

        dtype = transfer_dtype(cfg.weightsync, cfg.model, cfg.actor)
        publisher = Publisher.from_config(cfg.weightsync, cfg.broker, cfg.run, dtype)
    return RolloutIO(
        cfg.run,
        cfg.broker,
        cfg.algo,
        cfg.learner,
        cfg.model.lora,
        limits=Limits.from_config(
            cfg.rollout, cfg.broker, cfg.algo, cfg.completion_limit, cfg.reward_ranges
        ),
        vocab_size=vocab_size,
        # how the actors name each reward function's failures (its `name`, else `fn`)
        reward_names=[spec.name or spec.fn for spec in cfg.reward.functions],
        publisher=publisher,
        progress=progress,
    )


class GRPO(Trainer):
    """The RL learner of one rank: the trainer, and (rank 0) the Redis side.

    ``python -m streamrl.learner`` calls ``run``; tests drive ``train_next`` step by step.
    """

    name = "learner"
    progress_type = StreamProgress

    def __init__(self, cfg: Config, should_stop: Callable[[], bool] = lambda: False):
        super().__init__(
            cfg, horizon=cfg.run.max_steps, reference=cfg.algo.learner_scores_reference
        )
        self.should_stop = should_stop
        # the most tokens one completion may hold (a trajectory's, an agent's): the constant loss normaliser's
        self.completion_budget = Limits.from_config(
            cfg.rollout, cfg.broker, cfg.algo, cfg.completion_limit
        ).max_completion_tokens
        # the run's target and the recent step records' figures (rank 0 decides the stop)
        self.target = target.Target.of(cfg.run, cfg.reward_ranges)
        self.recent: deque[dict[str, float]] = deque(maxlen=cfg.run.target_window)
        # per reward function, the steps in a row on which it failed on most samples
        self.failing_steps: dict[str, int] = {}
        # why the run must stop (a reward that keeps failing); rank 0 decides, None while fine
        self.failure: str | None = None
        self.io = rollout_io(cfg, self.vocab_size, self.progress) if self.rank == 0 else None
        self.commits = (
            self.io.commits
            if self.io is not None
            else Commits(self.progress, cfg.learner.ack_policy)
        )
        # max_staleness: auto's controller (rank 0), from its lowest bound after every (re)start
        self.staleness_target = staleness_control.DriftTarget.from_config(cfg.algo, cfg.learner)
        self.staleness: staleness_control.ControlState | None = None
        if self.io is not None:
            self.io.resume(self.engine.module)
            self._start_staleness_control()
        self.phases.done("redis_io")
        self.phases.log(log, f"learner rank {self.rank}")
        pin_assigned(log, f"learner rank {self.rank}")

    def at_end(self, echo: Callable[[str], None]) -> None:
        if self.target_reached():
            echo(f"target reached: {target.describe(self.cfg.run)} at step {self.progress.step}")

    def train_next(self) -> dict | None:
        """Take the next batch and train it. Returns rank 0's step record ({} elsewhere; with
        ``trained`` false when every group of the batch was dropped), or None when it is time to stop."""
        while True:
            batch = (
                self.io.next_batch(self.progress.version, self.stop_requested) if self.io else None
            )
            batch = _broadcast(batch, self.rank, self.world)
            if batch is NoBatch.STOP:
                return None
            if batch is not NoBatch.IDLE:
                return self._train(batch)

    def _train(self, batch: Batch) -> dict:
        cfg, progress, io, commits = self.cfg, self.progress, self.io, self.commits
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
                    io.publish(progress.version, self.engine.module, commits.count_with(taken))

            self.mid_step = True
            updates = train_batch(
                self.engine,
                batch.samples,
                batch.version,
                algo=cfg.algo,
                learner=cfg.learner,
                rollout=cfg.rollout,
                seed=cfg.run.seed,
                rank=self.rank,
                world=self.world,
                pad_id=self.pad_id,
                ref_model=self.ref_model,
                after_update=after_update,
                skipped=batch.skipped,
                completion_budget=self.completion_budget,
            )
            progress.step += 1
            progress.samples += len(batch.samples)
            progress.tokens += first_pass_tokens(updates)
            self.mid_step = False
        commits.step_done(batch.entries, trained=bool(updates))
        row: dict = {}
        if io is not None:
            row = self.record_step(batch, updates, time.perf_counter() - t0)
            if updates:
                self.recent.append(self.target.measures(row))
            self._watch_rewards(row, batch.reward_errors)
        if updates:
            self.checkpoint_if_due()
        return row

    def record_step(self, batch: Batch, updates: list[UpdateStats], step_s: float) -> dict:
        """Rank 0: write the step's row (step log, trackers) and set the learner's metrics;
        returns the row."""
        row = step_row(self.progress, batch, updates, step_s, self.throughput)
        row.update(self._steer_staleness(row["is_ess"]))
        self.record(row, batch)
        self.io.watch_actors()
        if updates:
            _step_metrics(row, batch, updates)
        return row

    def _start_staleness_control(self) -> None:
        """Rank 0: the bound admission starts with (the fixed one; auto's lowest, published)."""
        algo = self.cfg.algo
        lowest = algo.staleness_range[0]
        if algo.max_staleness == "auto":
            self.staleness = staleness_control.start(self.staleness_target)
            # a bound a previous learner left would otherwise hold until the first change
            self.io.set_bound(lowest)
        m.MAX_STALENESS.set(lowest)

    def _steer_staleness(self, ess: float) -> dict:
        """Rank 0 under auto: the bound after a step that measured ``ess``, published for
        admission; the row's ``max_staleness`` and ``staleness_reason``."""
        if self.staleness is None:
            return {}
        bound, self.staleness, reason = staleness_control.decide(
            ess, self.staleness, self.staleness_target
        )
        # every step, changed or not: a Redis restarted without its data gets it back
        self.io.set_bound(bound)
        m.MAX_STALENESS.set(bound)
        return {"max_staleness": bound, "staleness_reason": reason}

    def save_checkpoint(self) -> None:
        """Collective. With ``ack_policy: checkpoint`` the entries it covers are acked right after."""
        t0 = time.perf_counter()
        if self.io is not None:
            # what the checkpoint holds is announced first (lineage reads the announced version)
            self.io.flush()
        super().save_checkpoint()
        if self.io is not None:
            m.STEP_PHASE.labels("checkpoint").observe(time.perf_counter() - t0)
        self.commits.checkpointed()

    def checkpoint_due(self) -> bool:
        """Steps since the last checkpoint, or entries it must list before they are acked."""
        return super().checkpoint_due() or self.commits.pending

    def _watch_rewards(self, row: dict, errors: dict[str, str]) -> None:
        """Count the steps in a row on which a reward function failed on more than half of the
        samples; at ``reward.max_failing_steps`` the run stops with its exception: a reward that
        scores 0 on most samples trains the policy on noise."""
        limit = self.cfg.reward.max_failing_steps
        for name, rate in row.get("reward_failure_rate", {}).items():
            streak = self.failing_steps.get(name, 0) + 1 if rate > 0.5 else 0
            self.failing_steps[name] = streak
            if streak >= limit and self.failure is None:
                self.failure = (
                    f"reward {name!r} failed on more than half of the samples of {streak} steps in "
                    f"a row (reward.max_failing_steps={limit}; {rate:.0%} at step {row['step']}); "
                    f"its exception: {errors.get(name, 'not reported')}"
                )

    def stop_requested(self) -> bool:
        cfg = self.cfg
        done = bool(cfg.run.max_steps) and self.progress.step >= cfg.run.max_steps
        late = bool(cfg.run.max_time_s) and time.monotonic() - self.started > cfg.run.max_time_s
        failed = self.failure is not None
        return done or late or failed or self.target_reached() or self.should_stop()

    def target_reached(self) -> bool:
        return self.target.reached(list(self.recent))

    def release(self) -> None:
        """Rank 0: Redis and the weights first (the last versions are announced), then the
        trainer's step log, trackers and endpoint."""
        try:
            if self.io is not None:
                self.io.close()
        finally:
            super().release()

    def describe(self, row: dict) -> str:
        parts = "".join(f" {name} {value:.3f}" for name, value in row["reward_parts"].items())
        parts += "".join(
            f" {name} FAILED {rate:.0%}"
            for name, rate in row.get("reward_failure_rate", {}).items()
            if rate > 0
        )
        return (
            f"step {row['step']:5d} v{row['version']:<5d} reward {row['reward_mean']:.3f}{parts} "
            f"loss {row['loss']:+.4f} tokens {row['tokens']:6d} stale {row['staleness_mean']:.2f} "
            f"wait {row['wait_s']:.2f}s step {row['step_s']:.2f}s"
        )


def step_row(
    progress: StreamProgress,
    batch: Batch,
    updates: list[UpdateStats],
    step_s: float,
    throughput: Throughput | None,
) -> dict:
    """The step's row: ``learner_steps.jsonl``'s, the trackers' and the console line's."""
    last = updates[-1] if updates else None
    # every pass's tokens over step_s (training and publishing, not the read): the learner's
    # throughput (the row's token counts are the batch's, first pass only)
    trained = sum(u.sequence_tokens for u in updates)
    return {
        "step": progress.step,
        "version": progress.version,
        # False for a batch whose every group was dropped (stale or zero-variance): no update
        "trained": bool(updates),
        **batch.log,
        "samples": len(batch.samples),
        "tokens": first_pass_tokens(updates),
        # prompt + completion tokens of the batch, and what its packed rows took
        "sequence_tokens": first_pass_tokens(updates, "sequence_tokens"),
        "packed_tokens": first_pass_tokens(updates, "packed_tokens"),
        "tokens_per_s": trained / step_s if step_s > 0 else math.nan,
        # the share of the learner GPUs' peak those tokens needed (learner.throughput); None
        # (empty, not 0) where the peak is unknown: a CPU learner, a GPU not in the table
        "mfu": throughput.mfu(trained, step_s) if throughput and updates else None,
        "loss": last.loss if last else math.nan,
        "clip_fraction": last.clip_fraction if last else math.nan,
        "is_weight_mean": last.is_weight_mean if last else math.nan,
        "is_truncated_fraction": last.is_truncated_fraction if last else math.nan,
        **off_policy(updates),
        "kl": last.kl if last else math.nan,
        "entropy": last.entropy if last else math.nan,
        "grad_norm": last.grad_norm if last else math.nan,
        # the last optimizer step's (learner.lr_scheduler)
        "lr": last.lr if last else math.nan,
        "step_s": step_s,
        # the share of the step's time the learner waited for data: actors short when high
        "learner_idle_fraction": idle_fraction(batch.log.get("wait_s", 0.0), step_s),
        "time": time.time(),
    }


def idle_fraction(wait_s: float, step_s: float) -> float:
    """The share of a step's wall time (the wait for its batch, then its training) spent waiting."""
    total = wait_s + step_s
    return wait_s / total if total > 0 else math.nan


def _step_metrics(row: dict, batch: Batch, updates: list[UpdateStats]) -> None:
    """A trained step's metrics: every objective's (``metrics.observe_step``), then RL's own."""
    last = updates[-1]
    m.observe_step(
        samples=len(batch.samples),
        tokens=row["tokens"],
        sequence_tokens=sum(u.sequence_tokens for u in updates),
        packed_tokens=sum(u.packed_tokens for u in updates),
        tokens_per_s=row["tokens_per_s"],
        mfu=row["mfu"],
        loss=last.loss,
        grad_norm=last.grad_norm,
    )
    m.CLIP_RATIO.set(last.clip_fraction)
    m.IS_WEIGHT_MEAN.set(last.is_weight_mean)
    m.IS_TRUNCATED.set(last.is_truncated_fraction)
    m.IS_ESS.set(row["is_ess"])
    m.BEHAVIOUR_KL.set(row["behaviour_kl"])
    m.STALE_TOKEN_FRACTION.set(row["stale_token_fraction"])
    m.LEARNER_IDLE.set(row["learner_idle_fraction"])
    m.KL.observe(last.kl)
    m.ENTROPY.set(last.entropy)
    for u in updates:
        m.STEP_PHASE.labels("forward_backward").observe(u.forward_backward_s)
        m.STEP_PHASE.labels("optimizer").observe(u.optimizer_s)


def _broadcast(obj, rank: int, world: int):
    if world == 1:
        return obj
    box = [obj if rank == 0 else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]
