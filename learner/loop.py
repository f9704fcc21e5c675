"""The learner loop: read a batch, train it on every rank, publish the weights, checkpoint, ack.

One step, as ``Learner.run`` drives it::

    batch = io.next_batch(version)     # rank 0: stream -> drop stale / zero-variance -> advantages
    batch = broadcast(batch)           # every rank trains the same batch on its balanced share
    train_batch(engine, batch, ...)    # learner.step: the loss of learner.algorithm, optimizer steps
      after each update: io.publish    # rank 0: stage the weights (one copy); a background thread
                                       #   writes them, then announces the version and admission's count
    commits.step_done(entries)         # count the step's groups for admission (ack_policy step: ack)
    io.record(row)                     # rank 0: step log, trackers, metrics
    every checkpoint_every steps: save_checkpoint, then commits.checkpointed (ack the entries)

Rank 0 alone talks to Redis, through ``learner.rollout_io``; the batch is small next to the model,
so ``broadcast_object_list`` over the gloo/NCCL group carries it to the other ranks, and their
weights stay identical.

A stop (SIGTERM through ``should_stop``) is honoured between steps only, and ``close`` saves a
checkpoint only at a step boundary: a step cut short by an error leaves its weights unsaved, and
its entries pending for the next learner. The commit bookkeeping (the consumed count; when entries are acked,
``learner.ack_policy``) is ``learner.commits``'s.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import torch
import torch.distributed as dist

from streamrl.broker.semantics import Limits
from streamrl.configs.schema import Config
from streamrl.learner import checkpoint, init_optimizer, target
from streamrl.learner import metrics as m
from streamrl.learner.commits import Commits, Progress
from streamrl.learner.engine import build_engine, device, init_distributed
from streamrl.learner.export import export_at_end
from streamrl.learner.prepare import Batch
from streamrl.learner.rollout_io import NoBatch, RolloutIO
from streamrl.learner.step import UpdateStats, first_pass_tokens, train_batch
from streamrl.learner.throughput import Throughput
from streamrl.policy.lora import reference_policy, training_policy
from streamrl.runtime.cpu_pinning import pin_assigned
from streamrl.runtime.startup_phases import Phases

log = logging.getLogger(__name__)


class Learner:
    """The learner of one rank: engine, resumed progress, and (rank 0) the Redis side.

    ``python -m streamrl.learner`` calls ``run``; tests drive ``train_next`` step by step.
    """

    def __init__(self, cfg: Config, should_stop: Callable[[], bool] = lambda: False):
        from streamrl.policy.load import load_policy, model_folder

        self.cfg = cfg
        self.started = time.monotonic()
        self.should_stop = should_stop
        phases = Phases()
        self.rank, self.world = init_distributed()
        phases.done("distributed")
        model = load_policy(cfg.model.path, cfg.model.dtype, str(device()), cfg.model.init_kwargs)
        model = training_policy(model, cfg.model.lora)
        self.pad_id = model.config.pad_token_id if model.config.pad_token_id is not None else 0
        # the most tokens one completion may hold (a trajectory's, an agent's): the constant loss normaliser's
        self.completion_budget = Limits.from_config(
            cfg.rollout, cfg.broker, cfg.algo, cfg.completion_limit
        ).max_completion_tokens
        phases.done("policy")
        self.engine = build_engine(cfg.learner, model, self.world, cfg.run.max_steps)
        phases.done("engine")
        self.ref_model = (
            reference_policy(cfg.model, self.engine.module, str(device()))
            if cfg.algo.learner_scores_reference
            else None
        )
        self.ckpt_root = Path(cfg.run.dir) / "checkpoints"
        state = init_optimizer.resume_or_start(
            self.engine, self.ckpt_root, self.rank, model_folder(cfg.model.path),
            cfg.learner.init_optimizer, "learner",
        )  # fmt: skip
        self.progress = Progress.from_state(state)
        self.last_ckpt_step = self.progress.step
        # between the start of a step's first update and its end: the weights are not a step's
        self.mid_step = False
        # the recent step records' figures for cfg.run.target_* (rank 0 decides the stop)
        self.recent: deque[dict[str, float]] = deque(maxlen=cfg.run.target_window)
        # per reward function, the steps in a row on which it failed on most samples
        self.failing_steps: dict[str, int] = {}
        # why the run must stop (a reward that keeps failing); rank 0 decides, None while fine
        self.failure: str | None = None
        self.io = (
            RolloutIO(
                cfg,
                model.config.vocab_size,
                self.progress,
                Throughput.of(self.engine.module, cfg.learner.peak_tflops, self.world),
            )
            if self.rank == 0
            else None
        )
        self.commits = (
            self.io.commits
            if self.io is not None
            else Commits(self.progress, cfg.learner.ack_policy)
        )
        if self.io is not None:
            self.io.resume(self.engine.module)
        phases.done("redis_io")
        phases.log(log, f"learner rank {self.rank}")
        pin_assigned(log, f"learner rank {self.rank}")

    def run(self, echo: Callable[[str], None] = print) -> Progress:
        """Train until run.max_steps / run.max_time_s / the run.target_* / ``should_stop()`` / the read timeout."""
        try:
            while (row := self.train_next()) is not None:
                if row:
                    echo(_format(row))
            if self.target_reached():
                echo(
                    f"target reached: {target.describe(self.cfg.run)} at step {self.progress.step}"
                )
        finally:
            self.close()
        return self.progress

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
            row = io.record(progress, batch, updates, time.perf_counter() - t0)
            if updates:
                self.recent.append(target.measures(row, self.cfg.reward_ranges))
            self._watch_rewards(row, batch.reward_errors)
        if updates and progress.step % cfg.learner.checkpoint_every == 0:
            self.save_checkpoint()
        return row

    def save_checkpoint(self) -> None:
        """Collective. With ``ack_policy: checkpoint`` the entries it covers are acked right after."""
        t0 = time.perf_counter()
        if self.io is not None:
            # what the checkpoint holds is announced first (lineage reads the announced version)
            self.io.flush()
        state = {"progress": asdict(self.progress)}
        checkpoint.save(self.engine, self.ckpt_root, self.progress.step, state, self.rank)
        self.last_ckpt_step = self.progress.step
        if self.io is not None:
            m.STEP_PHASE.labels("checkpoint").observe(time.perf_counter() - t0)
        self.commits.checkpointed()

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
        r = self.cfg.run
        bars = target.bars(r)
        return bool(bars) and target.window_reached(list(self.recent), bars, r.target_window)

    @property
    def model(self) -> torch.nn.Module:
        return self.engine.module

    def close(self) -> None:
        """Checkpoint what is not yet saved (at a step boundary only), export the policy (rank 0),
        then release Redis, weights, metrics."""
        try:
            if self.mid_step:
                log.warning(
                    "stopped inside step %d: not saving its half-updated weights; the next "
                    "learner resumes from step %d",
                    self.progress.step + 1,
                    self.last_ckpt_step,
                )
                return
            if self.progress.step > self.last_ckpt_step or self.commits.pending:
                self.save_checkpoint()
            if self.io is not None:
                export_at_end(
                    self.cfg.run,
                    self.cfg.model.path,
                    self.model,
                    self.progress.step,
                    self.progress.version,
                )
        finally:
            if self.io is not None:
                self.io.close()


def _broadcast(obj, rank: int, world: int):
    if world == 1:
        return obj
    box = [obj if rank == 0 else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _format(row: dict) -> str:
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
