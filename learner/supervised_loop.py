"""``streamrl sft`` and ``streamrl dpo``: supervised training on the RL learner, from a dataset file.

The same policy loading and LoRA (``policy``), DeepSpeed ZeRO engine with its LR schedule and
gradient checkpointing (``engine.build_engine``), token packing with per-sample position ids
(``batching``, through ``supervised_batches``), checkpoints with exact resume (``checkpoint``: a
resumed run continues at the step after the checkpoint, in the same epoch order), step rows in
``<run.dir>/learner_steps.jsonl`` and the trackers (``tracking``), and the export to a Hugging
Face folder (``export``). No actors, no Redis: every rank reads the dataset itself.

One step is ``supervised.batch_size`` examples (or pairs), one optimizer step. Losses are
normalised by the whole step (every rank) and multiplied by the world size, because DeepSpeed
averages gradients over ranks (as ``learner.step`` does). DPO's reference is
``policy.lora.reference_policy``, the KL reference of RL: the starting weights, or the same model
with its adapters off.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from streamrl.configs.redact import redacted
from streamrl.configs.schema import Config
from streamrl.learner import checkpoint, init_optimizer
from streamrl.learner import supervised_batches as sb
from streamrl.learner import supervised_data as data
from streamrl.learner import supervised_loss as losses
from streamrl.learner.batching import MicroBatch, Sample
from streamrl.learner.engine import (
    build_engine,
    device,
    init_distributed,
    mark_micro_batch,
    set_micro_batches,
    token_logprobs,
)
from streamrl.learner.export import default_out, export_at_end
from streamrl.learner.throughput import Throughput
from streamrl.learner.tracking import Tracker
from streamrl.runtime.jsonl_log import JsonlLog

log = logging.getLogger(__name__)

KINDS = ("sft", "dpo")


@dataclass
class Progress:
    """Where a supervised run stands; checkpointed (``version`` is the step, for the export)."""

    step: int = 0
    samples: int = 0
    tokens: int = 0

    @property
    def version(self) -> int:
        return self.step


@dataclass
class StepBatch:
    """What the trackers' sample table reads of a step."""

    samples: list[Sample]


class SupervisedRun:
    """One rank of ``streamrl sft`` (``kind`` sft) or ``streamrl dpo`` (``kind`` dpo)."""

    def __init__(self, cfg: Config, kind: str):
        from streamrl.policy.load import load_policy, load_tokenizer, model_folder
        from streamrl.policy.lora import reference_policy, training_policy

        if kind not in KINDS:
            raise ValueError(f"unknown supervised kind {kind!r}: one of {KINDS}")
        if not cfg.supervised.path:
            raise ValueError(f"streamrl {kind} needs supervised.path: the dataset file")
        self.cfg, self.kind, self.sc = cfg, kind, cfg.supervised
        self.rank, self.world = init_distributed()
        tokenizer = load_tokenizer(cfg.model.path)
        load = data.load_pairs if kind == "dpo" else data.load_sft
        self.examples = load(self.sc.path, tokenizer, self.sc.max_length)
        model = training_policy(
            load_policy(cfg.model.path, cfg.model.dtype, str(device())), cfg.model.lora
        )
        self.pad_id = model.config.pad_token_id if model.config.pad_token_id is not None else 0
        self.total_steps = (
            sb.steps_per_epoch(len(self.examples), self.sc.batch_size) * self.sc.epochs
        )
        if cfg.run.max_steps:
            self.total_steps = min(self.total_steps, cfg.run.max_steps)
        # one optimizer step a step: the schedule's horizon is the run's steps, whatever the RL knobs
        one_update = cfg.learner.model_copy(update={"minibatches": 1, "updates_per_batch": 1})
        self.engine = build_engine(one_update, model, self.world, self.total_steps)
        # the step row's mfu, as the RL learner's (learner.throughput)
        self.throughput = Throughput.of(self.engine.module, cfg.learner.peak_tflops, self.world)
        self.ref_model = (
            reference_policy(cfg.model, self.engine.module, str(device()))
            if kind == "dpo"
            else None
        )
        self.ckpt_root = Path(cfg.run.dir) / "checkpoints"
        # as the RL learner: the AdamW state a warm start left next to the policy, where it fits
        state = init_optimizer.resume_or_start(
            self.engine, self.ckpt_root, self.rank, model_folder(cfg.model.path),
            cfg.learner.init_optimizer, kind,
        )  # fmt: skip
        self.progress = Progress(**state["progress"]) if state else Progress()
        self.saved_step = self.progress.step
        self.steps_log = self.tracker = None
        if self.rank == 0:
            Path(cfg.run.dir).mkdir(parents=True, exist_ok=True)
            self.steps_log = JsonlLog(Path(cfg.run.dir) / "learner_steps.jsonl")
            self.tracker = Tracker(cfg.run, cfg.model.path, redacted(cfg))

    def run(self, echo: Callable[[str], None] = print) -> Progress:
        """Train to the end of ``supervised.epochs`` (or ``run.max_steps`` / ``run.max_time_s``),
        checkpoint, export."""
        started = time.monotonic()
        limit = self.cfg.run.max_time_s
        try:
            while self.progress.step < self.total_steps:
                if limit and time.monotonic() - started > limit:
                    break
                row = self.train_step()
                if row:
                    echo(_format(row))
                if self.progress.step % self.cfg.learner.checkpoint_every == 0:
                    self.save_checkpoint()
            self.finish()
        finally:
            self.close()
        return self.progress

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
        if self.kind == "dpo":
            sums = self._dpo_step(picked)
            samples = [s for pair in picked for s in pair]
        else:
            sums = self._sft_step(picked)
            samples = picked
        sums = _all_reduce(sums)
        grad_norm = self.engine.get_global_grad_norm()
        self.progress.step += 1
        self.progress.samples += len(picked)
        self.progress.tokens += int(sums["tokens"])
        step_s = time.perf_counter() - t0
        if self.rank != 0:
            return {}
        row = {
            "step": self.progress.step,
            "epoch": (self.progress.step - 1)
            // sb.steps_per_epoch(len(self.examples), self.sc.batch_size),
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
        }
        if self.kind == "dpo":
            pairs = max(sums["pairs"], 1.0)
            row.update(
                chosen_reward=sums["chosen_reward"] / pairs,
                rejected_reward=sums["rejected_reward"] / pairs,
                reward_margin=(sums["chosen_reward"] - sums["rejected_reward"]) / pairs,
                reward_accuracy=sums["accurate"] / pairs,
            )
        self.steps_log.write(row)
        self.tracker.log(row, StepBatch(samples))
        return row

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

    def _sft_step(self, samples: list[Sample]) -> dict[str, float]:
        normalizer = float(max(sb.trained_tokens(samples), 1))
        batches, real = sb.sample_micro_batches(
            samples,
            self.world,
            self.rank,
            self.cfg.learner.micro_batch_tokens,
            self.pad_id,
            device(),
        )

        def loss_of(logprobs, mb: MicroBatch, _real: bool):
            loss = losses.sft_loss(logprobs, mb.completion_mask, normalizer)
            return loss, {"tokens": mb.num_tokens}

        return self._micro_steps(batches, real, loss_of)

    def _dpo_step(self, pairs: list[sb.Pair]) -> dict[str, float]:
        sc = self.sc
        batches, real = sb.pair_micro_batches(
            pairs,
            self.world,
            self.rank,
            self.cfg.learner.micro_batch_tokens,
            self.pad_id,
            device(),
        )
        with torch.no_grad():
            refs = [token_logprobs(self.ref_model, mb, 1.0) for mb in batches]
        refs_iter = iter(refs)

        def loss_of(logprobs, mb: MicroBatch, is_real: bool):
            ref = next(refs_iter)
            mask = mb.completion_mask
            policy, reference = losses.row_sums(logprobs, mask), losses.row_sums(ref, mask)
            counts = mask.sum(-1).to(policy.dtype)
            margin = losses.dpo_margin(
                policy[0::2],
                policy[1::2],
                reference[0::2],
                reference[1::2],
                sc.loss,
                counts[0::2],
                counts[1::2],
            )
            if not is_real:
                # a filler keeps the collective backward but trains nothing
                return 0.0 * logprobs.sum(), {"tokens": 0}
            loss = losses.dpo_losses(margin, sc.beta, sc.loss).sum() / len(pairs)
            chosen = losses.implicit_rewards(policy[0::2], reference[0::2], sc.beta)
            rejected = losses.implicit_rewards(policy[1::2], reference[1::2], sc.beta)
            return loss, {
                "tokens": mb.num_tokens,
                "pairs": len(chosen),
                "chosen_reward": float(chosen.sum()),
                "rejected_reward": float(rejected.sum()),
                "accurate": float((chosen > rejected).sum()),
            }

        return self._micro_steps(batches, real, loss_of)

    def save_checkpoint(self) -> None:
        """Collective."""
        state = {"progress": asdict(self.progress)}
        checkpoint.save(self.engine, self.ckpt_root, self.progress.step, state, self.rank)
        self.saved_step = self.progress.step

    def finish(self) -> None:
        """Collective: the last checkpoint, the export (rank 0) and, with
        ``supervised.save_optimizer``, the AdamW state next to it."""
        if self.progress.step > self.saved_step:
            self.save_checkpoint()
        moments = engine_moments(self.engine) if self.sc.save_optimizer else None
        if self.rank != 0:
            return
        out = export_at_end(
            self.cfg.run,
            self.cfg.model.path,
            self.engine.module,
            self.progress.step,
            self.progress.version,
        )
        if out is not None and moments is not None:
            init_optimizer.write(out, *moments)

    def close(self) -> None:
        if self.steps_log is not None:
            self.steps_log.close()
            self.tracker.close()


def engine_moments(engine) -> tuple:
    """Collective: (step, betas, eps, amsgrad, moments by name) of the engine's AdamW, gathered
    from the ZeRO partitions, as ``init_optimizer.write`` takes them."""
    optimizer = engine.optimizer
    base = init_optimizer.base_optimizer(optimizer)
    betas, eps, amsgrad = init_optimizer.settings(base)
    params = init_optimizer.trainable(engine.module)
    moments: dict[str, dict[str, torch.Tensor]] = {key: {} for key in init_optimizer.MOMENTS}
    if hasattr(optimizer, "single_partition_of_fp32_groups"):
        from deepspeed.utils import safe_get_full_optimizer_state

        step = int(base.state[optimizer.single_partition_of_fp32_groups[0]]["step"])
        for name, param in params.items():
            for key in init_optimizer.MOMENTS:
                full = safe_get_full_optimizer_state(param, key)
                moments[key][name] = full.detach().to("cpu", torch.float32).clone()
    else:
        step = int(base.state[next(iter(params.values()))]["step"])
        for name, param in params.items():
            for key in init_optimizer.MOMENTS:
                moments[key][name] = (
                    base.state[param][key].detach().to("cpu", torch.float32).clone()
                )
    return step, betas, eps, amsgrad, moments


def _all_reduce(sums: dict[str, float]) -> dict[str, float]:
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return sums
    keys = sorted(sums)
    t = torch.tensor([sums[k] for k in keys], dtype=torch.float64)
    if dist.get_backend() == "nccl":
        t = t.to(torch.device("cuda", torch.cuda.current_device()))
    dist.all_reduce(t)
    # the loss is every rank's share of the step's: the sum; so are the counts
    return dict(zip(keys, t.tolist(), strict=True))


def _format(row: dict) -> str:
    extra = (
        f" margin {row['reward_margin']:+.3f} accuracy {row['reward_accuracy']:.2f}"
        if "reward_margin" in row
        else ""
    )
    return (
        f"step {row['step']:5d} epoch {row['epoch']} loss {row['loss']:.4f}{extra} "
        f"tokens {row['tokens']:6d} {row['tokens_per_s']:.0f} tok/s step {row['step_s']:.2f}s"
    )


def train(cfg: Config, kind: str, echo: Callable[[str], None] = print) -> Progress:
    """Run ``streamrl sft`` (``kind`` sft) or ``streamrl dpo`` on this rank to its end."""
    runner = SupervisedRun(cfg, kind)
    progress = runner.run(echo)
    if runner.rank == 0 and cfg.run.export_at_end and progress.step:
        echo(f"{kind}: {progress.step} steps; the policy is at {default_out(cfg.run.dir)}")
    if dist.is_initialized():
        dist.destroy_process_group()
    return progress
