"""``streamrl sft`` and ``streamrl dpo``: the trainer on a dataset file instead of the stream.

``Supervised`` is what SFT (``learner.sft``) and DPO (``learner.dpo``) share on top of the
trainer (``learner.trainer``: policy, LoRA, engine, checkpoints, export, step rows, trackers,
endpoint): the examples of ``supervised.path`` (``supervised_data``), the order the steps take
them in (``supervised_batches``: a resumed run continues at the step after its checkpoint, in the
same epoch order), the micro-batch loop of one optimizer step and the step row. An objective
supplies how its rows load, its step's micro-batches and loss (``supervised_loss``), and the
figures its row adds. No actors, no Redis: every rank reads the dataset itself.

One step is ``supervised.batch_size`` examples (or pairs), one optimizer step. Losses are
normalised by the whole step (every rank) and multiplied by the world size, because DeepSpeed
averages gradients over ranks (as ``learner.step`` does).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from streamrl.configs.schema import Config, SupervisedConfig
from streamrl.learner import init_optimizer
from streamrl.learner import metrics as m
from streamrl.learner import supervised_batches as sb
from streamrl.learner.batching import MicroBatch, Sample, rank_micro_batches
from streamrl.learner.engine import (
    device,
    mark_micro_batch,
    set_micro_batches,
    sum_over_ranks,
    token_logprobs,
)
from streamrl.learner.export import default_out
from streamrl.learner.progress import Progress
from streamrl.learner.trainer import Trainer


@dataclass
class StepBatch:
    """What the trackers' sample table reads of a step."""

    samples: list[Sample]


class Supervised(Trainer):
    """One rank of a supervised run; ``SFT`` and ``DPO`` supply ``load``, ``step`` and the row's
    figures."""

    # whether the loss scores against the frozen reference (``policy.lora.reference_policy``)
    reference = False

    def __init__(self, cfg: Config, examples: list | None = None):
        """``examples``: the dataset's, when the command loaded them already (``examples_of``)."""
        self.sc = cfg.supervised
        if examples is None:
            examples = self.examples_of(cfg.supervised, cfg.model.path)
        self.examples = examples
        self.steps_per_epoch = sb.steps_per_epoch(len(self.examples), self.sc.batch_size)
        self.total_steps = self.steps_per_epoch * self.sc.epochs
        if cfg.run.max_steps:
            self.total_steps = min(self.total_steps, cfg.run.max_steps)
        # one optimizer step a step: the schedule's horizon is the run's steps, whatever the RL knobs
        one_update = cfg.learner.model_copy(update={"minibatches": 1, "updates_per_batch": 1})
        super().__init__(
            cfg, horizon=self.total_steps, reference=self.reference, engine_settings=one_update
        )

    @classmethod
    def examples_of(cls, sc: SupervisedConfig, model_path: str) -> list:
        """The examples of ``supervised.path`` under the tokenizer of ``model_path``
        (SupervisedDataError names a row that cannot train): a command loads them before it makes
        anything (``launch.supervised``)."""
        from streamrl.policy.load import load_tokenizer

        if not sc.path:
            raise ValueError(f"streamrl {cls.name} needs supervised.path: the dataset file")
        return cls.load(sc.path, load_tokenizer(model_path), sc.max_length)

    @staticmethod
    def load(path: str, tokenizer, max_length: int) -> list:
        """The dataset's examples, as ``step`` takes them."""
        raise NotImplementedError

    def step(self, picked: list) -> dict[str, float]:
        """One optimizer step over this step's examples (``_micro_steps``): this rank's sums."""
        raise NotImplementedError

    def samples_of(self, picked: list) -> list[Sample]:
        """The ``Sample``s of this step's examples (the trackers' sample table)."""
        return picked

    def figures(self, sums: dict[str, float]) -> dict[str, float]:
        """What the objective adds to the step row, from the step's sums over ranks."""
        return {}

    def train_next(self) -> dict | None:
        """The next step's row ({} on the other ranks), or None at the end of ``supervised.epochs``,
        ``run.max_steps`` or ``run.max_time_s``."""
        limit = self.cfg.run.max_time_s
        if self.progress.step >= self.total_steps or (
            limit and time.monotonic() - self.started > limit
        ):
            return None
        self.mid_step = True
        row = self.train_step()
        self.mid_step = False
        self.checkpoint_if_due()
        return row

    def train_step(self) -> dict:
        """The next step; rank 0's step row ({} elsewhere)."""
        t0 = time.perf_counter()
        # the LR this step trains with (the scheduler moves on at its optimizer step)
        lr = self.engine.get_lr()[0]
        picked = [
            self.examples[i]
            for i in sb.step_indices(
                len(self.examples),
                self.sc.batch_size,
                self.progress.step,
                self.cfg.run.seed,
                self.sc.shuffle,
            )
        ]
        sums = _sum_over_ranks(self.step(picked))
        grad_norm = self.engine.get_global_grad_norm()
        p = self.progress
        p.step += 1
        p.version += 1
        p.samples += len(picked)
        p.tokens += int(sums["tokens"])
        step_s = time.perf_counter() - t0
        if self.rank != 0:
            return {}
        row = {
            "step": p.step,
            "epoch": (p.step - 1) // self.steps_per_epoch,
            "samples": len(picked),
            "tokens": int(sums["tokens"]),
            "sequence_tokens": int(sums["sequence_tokens"]),
            "packed_tokens": int(sums["packed_tokens"]),
            "tokens_per_s": sums["sequence_tokens"] / step_s if step_s > 0 else 0.0,
            "mfu": self.throughput.mfu(sums["sequence_tokens"], step_s),
            "loss": sums["loss"],
            "grad_norm": float(grad_norm) if grad_norm is not None else 0.0,
            "lr": lr,
            "step_s": step_s,
            "time": time.time(),
            **self.figures(sums),
        }
        self.record(row, StepBatch(self.samples_of(picked)))
        m.observe_step(
            samples=row["samples"],
            tokens=row["tokens"],
            sequence_tokens=sums["sequence_tokens"],
            packed_tokens=sums["packed_tokens"],
            tokens_per_s=row["tokens_per_s"],
            mfu=row["mfu"],
            loss=row["loss"],
            grad_norm=row["grad_norm"],
        )
        return row

    def micro_batches(
        self, picked: list, pack: Callable = rank_micro_batches
    ) -> tuple[list[MicroBatch], int]:
        """This rank's micro-batches of the step's examples as ``pack`` shares them out
        (``batching.rank_micro_batches``' arguments), fillers included, and how many are real."""
        budget = self.cfg.learner.micro_batch_tokens
        return pack(picked, self.world, self.rank, budget, self.pad_id, device())

    def _micro_steps(self, batches: list[MicroBatch], real: int, loss_of) -> dict[str, float]:
        """One optimizer step over ``batches``; ``loss_of(logprobs, mb, real)`` gives a micro-batch's
        loss and the figures it adds to the step's sums."""
        sums: dict[str, float] = {}
        set_micro_batches(self.engine, len(batches))
        for i, mb in enumerate(batches):
            mark_micro_batch(self.engine, i, len(batches))
            logprobs = token_logprobs(self.engine, mb, 1.0)
            loss, figures = loss_of(logprobs, mb, i < real)
            self.engine.backward(loss * self.world, scale_wrt_gas=False)
            self.engine.step()
            figures.update(
                loss=float(loss.detach()),
                sequence_tokens=mb.sequence_tokens,
                packed_tokens=mb.packed_tokens if i < real else 0,
            )
            for key, value in figures.items():
                sums[key] = sums.get(key, 0.0) + float(value)
        return sums

    def export(self) -> Path | None:
        """Collective: the trainer's export and, with ``supervised.save_optimizer``, the AdamW
        state next to it."""
        moments = init_optimizer.engine_moments(self.engine) if self.sc.save_optimizer else None
        out = super().export()
        if out is not None and moments is not None:
            init_optimizer.write(out, *moments)
        return out

    def describe(self, row: dict) -> str:
        return (
            f"step {row['step']:5d} epoch {row['epoch']} loss {row['loss']:.4f}"
            f"{self.describe_figures(row)} "
            f"tokens {row['tokens']:6d} {row['tokens_per_s']:.0f} tok/s step {row['step_s']:.2f}s"
        )

    def describe_figures(self, row: dict) -> str:
        """The console line's part for ``figures`` (none by default)."""
        return ""


def _sum_over_ranks(sums: dict[str, float]) -> dict[str, float]:
    # the loss is every rank's share of the step's: the sum; so are the counts
    keys = sorted(sums)
    total = sum_over_ranks(torch.tensor([sums[k] for k in keys], dtype=torch.float64))
    return dict(zip(keys, total.tolist(), strict=True))


def train(
    cfg: Config,
    objective: type[Supervised],
    echo: Callable[[str], None] = print,
    on_step: Callable[[str, int, int], None] | None = None,
    examples: list | None = None,
    on_row: Callable[[dict], None] | None = None,
) -> Progress:
    """Run ``objective`` (``SFT`` for ``streamrl sft``, ``DPO`` for ``streamrl dpo``) on this rank
    to its end. ``on_step(line, step, total_steps)``, when given, takes each step's line instead
    of ``echo`` (a console bar: ``launch.view.StepBar``); ``examples``: the dataset's, loaded
    already (``Supervised.examples_of``); ``on_row(row)``: each step row (rank 0)."""
    runner = objective(cfg, examples)
    if on_step is not None:
        progress = runner.run(
            lambda line: on_step(line, runner.progress.step, runner.total_steps), on_row
        )
    else:
        progress = runner.run(echo, on_row)
    if runner.rank == 0 and cfg.run.export_at_end and progress.step:
        echo(f"{runner.name}: {progress.step} steps; the policy is at {default_out(cfg.run.dir)}")
    return progress
