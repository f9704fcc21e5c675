"""The trainer every objective runs on: one rank's policy, engine, checkpoints and step rows.

``Trainer`` owns what RL (``learner.grpo``), SFT (``learner.sft``) and DPO (``learner.dpo``)
share: the policy with its LoRA adapters and, where the loss scores against one, its frozen
reference (``policy.lora``); the DeepSpeed ZeRO engine with its LR schedule and the packing
(``engine``, ``batching``); checkpoints with exact resume and the AdamW state a warm start left
(``checkpoint``, ``init_optimizer``); the export to a Hugging Face folder (``export``); and, on
rank 0, the step rows in ``<run.dir>/learner_steps.jsonl``, the trackers (``tracking``) and the
Prometheus endpoint of the learner's metrics (``learner.metrics``). An objective supplies its
batches and its loss: ``train_next`` trains the next step and returns its row (None when it is
time to stop), and ``describe`` is its console line.

One run, as ``run`` drives it::

    while (row := trainer.train_next()) is not None:   # the objective's step (checkpoints due)
        echo(trainer.describe(row))
    trainer.close()                                    # the last checkpoint, the export, release

A checkpoint is saved only at a step boundary: a step cut short by an error (``mid_step``)
leaves its weights unsaved, and the run resumes from the last checkpoint.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import torch

from streamrl.broker.client import RedisNotConfigured, redis_url
from streamrl.configs.redact import redacted
from streamrl.configs.schema import BrokerConfig, Config, LearnerConfig, MetricsConfig, RunConfig
from streamrl.learner import checkpoint, init_optimizer
from streamrl.learner.engine import build_engine, device, init_distributed
from streamrl.learner.export import export_at_end
from streamrl.learner.progress import Progress
from streamrl.learner.throughput import Throughput
from streamrl.learner.tracking import Tracker
from streamrl.policy.lora import reference_policy, training_policy
from streamrl.runtime import metrics_endpoint
from streamrl.runtime.jsonl_log import JsonlLog
from streamrl.runtime.startup_phases import Phases

log = logging.getLogger(__name__)

STEPS_FILE = "learner_steps.jsonl"


def rank0_endpoint(
    metrics: MetricsConfig, broker: BrokerConfig, run: RunConfig
) -> metrics_endpoint.Endpoint:
    """Rank 0's endpoint, listed in the run's Redis. A run without one (``streamrl sft`` alone) has
    nowhere to list it: no endpoint."""
    endpoint = metrics_endpoint.Endpoint.from_config(metrics, broker, run)
    try:
        redis_url(broker, run.dir)
    except RedisNotConfigured:
        return dataclasses.replace(endpoint, enabled=False)
    return endpoint


class Trainer:
    """One rank of a training run; each objective subclasses it (``GRPO``, ``SFT``, ``DPO``)."""

    # what the logs call this trainer: "learner" (RL), "sft", "dpo"
    name: str
    # what its checkpoints restore besides weights and optimizer
    progress_type: type[Progress] = Progress

    def __init__(
        self,
        cfg: Config,
        *,
        horizon: int,
        reference: bool,
        engine_settings: LearnerConfig | None = None,
    ):
        """``horizon``: the steps the LR schedule runs over (0: none); ``reference``: whether the
        loss scores against the frozen reference; ``engine_settings``: ``cfg.learner`` as the
        engine takes it (by default as it is)."""
        from streamrl.policy.load import load_policy, model_folder

        self.cfg = cfg
        self.started = time.monotonic()
        self.phases = Phases()
        self.rank, self.world = init_distributed()
        self.phases.done("distributed")
        model = load_policy(cfg.model.path, cfg.model.dtype, str(device()), cfg.model.init_kwargs)
        model = training_policy(model, cfg.model.lora)
        self.pad_id = model.config.pad_token_id if model.config.pad_token_id is not None else 0
        self.vocab_size = model.config.vocab_size
        self.phases.done("policy")
        self.engine = build_engine(engine_settings or cfg.learner, model, self.world, horizon)
        self.phases.done("engine")
        self.ref_model = (
            reference_policy(cfg.model, self.engine.module, str(device())) if reference else None
        )
        self.ckpt_root = Path(cfg.run.dir) / "checkpoints"
        # a resumed run's checkpoint holds its optimizer; a new one may start from a warm start's
        state = init_optimizer.resume_or_start(
            self.engine, self.ckpt_root, self.rank, model_folder(cfg.model.path),
            cfg.learner.init_optimizer, self.name,
        )  # fmt: skip
        self.progress = self.progress_type.from_state(state)
        self.saved_step = self.progress.step
        # between the start of a step's first update and its end: the weights are not a step's
        self.mid_step = False
        # the step row's mfu (learner.throughput)
        self.throughput = Throughput.of(self.engine.module, cfg.learner.peak_tflops, self.world)
        self.steps_log: JsonlLog | None = None
        self.tracker: Tracker | None = None
        self.endpoint: metrics_endpoint.Endpoint | None = None
        self.metrics_port = 0
        if self.rank == 0:
            run_dir = Path(cfg.run.dir)
            run_dir.mkdir(parents=True, exist_ok=True)
            self.steps_log = JsonlLog(run_dir / STEPS_FILE)
            self.tracker = Tracker(cfg.run, cfg.model.path, redacted(cfg))
            self.endpoint = rank0_endpoint(cfg.metrics, cfg.broker, cfg.run)
            self.metrics_port = metrics_endpoint.serve(
                self.endpoint, "learner", "0", cfg.learner.metrics_port
            )

    @property
    def model(self) -> torch.nn.Module:
        return self.engine.module

    def train_next(self) -> dict | None:
        """Train the next step. Returns rank 0's step row ({} on the other ranks), or None when it
        is time to stop."""
        raise NotImplementedError

    def describe(self, row: dict) -> str:
        """The console line of a step row."""
        raise NotImplementedError

    def run(
        self, echo: Callable[[str], None] = print, on_row: Callable[[dict], None] | None = None
    ) -> Progress:
        """Train until ``train_next`` says stop, then ``close``; rank 0 echoes each step's line and
        hands its row to ``on_row``."""
        try:
            while (row := self.train_next()) is not None:
                if row:
                    echo(self.describe(row))
                    if on_row is not None:
                        on_row(row)
            self.at_end(echo)
        finally:
            self.close()
        return self.progress

    def at_end(self, echo: Callable[[str], None]) -> None:
        """The objective's last console lines, once training stopped (none by default)."""

    def record(self, row: dict, batch) -> None:
        """Rank 0: the step's row to the step log and the trackers (whose sample table reads
        ``batch.samples``)."""
        self.steps_log.write(row)
        self.tracker.log(row, batch)

    def checkpoint_if_due(self) -> None:
        """Every ``learner.checkpoint_every`` steps, after the step."""
        if self.progress.step % self.cfg.learner.checkpoint_every == 0:
            self.save_checkpoint()

    def save_checkpoint(self) -> None:
        """Collective."""
        state = {"progress": asdict(self.progress)}
        checkpoint.save(self.engine, self.ckpt_root, self.progress.step, state, self.rank)
        self.saved_step = self.progress.step

    def checkpoint_due(self) -> bool:
        """Whether the run must checkpoint before it stops: steps trained since the last one."""
        return self.progress.step > self.saved_step

    def export(self) -> Path | None:
        """Collective: the policy as a Hugging Face folder (rank 0, ``run.export_at_end``);
        returns its path on rank 0 when it wrote one."""
        if self.rank != 0:
            return None
        run, model = self.cfg.run, self.cfg.model
        return export_at_end(run, model.path, self.model, self.progress.step, self.progress.version)

    def close(self) -> None:
        """Checkpoint what is not yet saved (at a step boundary only), export the policy, then
        ``release``."""
        try:
            if self.mid_step:
                log.warning(
                    "stopped inside step %d: not saving its half-updated weights; the next "
                    "learner resumes from step %d",
                    self.progress.step + 1,
                    self.saved_step,
                )
                return
            if self.checkpoint_due():
                self.save_checkpoint()
            self.export()
        finally:
            self.release()

    def release(self) -> None:
        """Rank 0: stop the endpoint, close the step log and the trackers (once); saves nothing."""
        if self.steps_log is None:
            return
        if self.metrics_port:
            metrics_endpoint.unregister(self.endpoint, "learner", "0", self.metrics_port)
        self.steps_log.close()
        self.tracker.close()
        self.steps_log = None
