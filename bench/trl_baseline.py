"""TRL's ``GRPOTrainer`` on a benchmark task, set up like streamrl's preset: the TRL system of
``bench.system`` (docs/bench/system.md) and ``bench.longtail`` (docs/bench/longtail.md).

Same warmed tiny Qwen2 and char tokenizer (the task's ``build_policy``),
same prompts (raw ``"314>"`` strings, no chat template), same shaped reward, and
every hyper-parameter TRL has an equivalent for taken from the task's preset
(``configs/demo_cpu.yaml``, see ``grpo_config_kwargs``): group size, prompts per
step, new tokens, sampling, AdamW lr/betas/weight decay, grad clip, clip range,
k3 KL coefficient to the initial policy, passes and disjoint mini-batches per
rollout batch (TRL's ``num_iterations`` and ``steps_per_generation``), and the
token-mean loss (TRL's ``"dapo"``: normalised by the active tokens of the whole
accumulated batch; with one batch per step that is streamrl's
``aggregation: token_mean``). Transformers ``generate`` on the CPU with one torch
thread. TRL alternates generation and training synchronously in one process,
which is what streamrl is measured against.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bench.tasks import DEMO, Task
from streamrl.examples.reverse_digits.rewards import reverse_digits_reward
from streamrl.learner import target

DEMO_CONFIG = "configs/demo_cpu.yaml"
EXACT_REWARD = 0.999


def grpo_config_kwargs(
    seed: int, output_dir: str, config_path: str = DEMO_CONFIG, overrides: Sequence[str] = ()
) -> dict:
    """The exact ``GRPOConfig`` arguments of the TRL runs.

    Everything with a TRL equivalent comes from streamrl's config, so the two
    run the same algorithm as far as TRL allows.
    """
    from streamrl.configs import load_config

    cfg = load_config(config_path, list(overrides), env={})
    r, a, lrn = cfg.rollout, cfg.algo, cfg.learner
    if a.aggregation != "token_mean":
        raise ValueError(
            f"the TRL baseline maps only aggregation=token_mean, not {a.aggregation!r}"
        )
    rollout = lrn.groups_per_step * r.group_size
    if rollout % lrn.minibatches:
        raise ValueError(
            f"learner.minibatches ({lrn.minibatches}) must divide the {rollout} samples of a step"
        )
    return {
        "output_dir": output_dir,
        "seed": seed,
        "use_cpu": True,
        # TRL's base config turns both on by default; streamrl trains in fp32 without recomputation.
        "bf16": False,
        "gradient_checkpointing": False,
        "report_to": "none",
        "save_strategy": "no",
        "logging_steps": 10,
        "disable_tqdm": True,
        # the time budget stops training, via StepRecorder
        "max_steps": 100_000,
        # One generation batch of groups_per_step prompts x group_size completions, shuffled and split
        # into `minibatches` optimizer steps, `updates_per_batch` passes (TRL's num_iterations).
        "num_generations": r.group_size,
        "per_device_train_batch_size": rollout // lrn.minibatches,
        "gradient_accumulation_steps": 1,
        "steps_per_generation": lrn.minibatches,
        "num_iterations": lrn.updates_per_batch,
        "max_completion_length": r.max_new_tokens,
        "temperature": r.temperature,
        "top_p": r.top_p,
        "top_k": r.top_k,
        "use_vllm": False,
        "learning_rate": lrn.lr,
        "lr_scheduler_type": "constant" if not lrn.warmup_steps else "constant_with_warmup",
        "warmup_steps": lrn.warmup_steps,
        "adam_beta1": lrn.betas[0],
        "adam_beta2": lrn.betas[1],
        "weight_decay": lrn.weight_decay,
        "max_grad_norm": lrn.grad_clip,
        "epsilon": a.clip_low,
        "epsilon_high": a.clip_high,
        "beta": a.kl_coef,
        "loss_type": "dapo",
        "scale_rewards": "group" if a.advantage == "grpo" else "none",
        "mask_truncated_completions": False,
    }


def score(raw_text: str, answer: str) -> float:
    """The demo reward of one TRL completion, decoded with its special tokens (EOS included when it
    stopped): TRL's own text drops them, and ``4<|pad|>13`` would read as the answer ``413``."""
    return sum(reverse_digits_reward(raw_text, answer).values())


def time_to_target(
    curve: list[tuple[float, float, float]], reward: float, exact: float, window: int
) -> float | None:
    """Elapsed time of the first rollout whose last ``window`` means reach both bars (learner.target)."""
    from streamrl.examples.reverse_digits.rewards import EXACT_PART

    rows = [{target.REWARD: r, EXACT_PART: e} for _, r, e in curve]
    end = target.first_reached(rows, {target.REWARD: reward, EXACT_PART: exact}, window)
    return None if end is None else curve[end][0]


@dataclass
class StepRecorder:
    """TRL reward function and step clock in one: scores each rollout, stamps it at the end of the
    optimizer step that generated it (with mini-batches, later steps of a rollout add no point)."""

    tokenizer: object
    started: float
    max_time_s: float
    stop_at_target: bool = False
    target: tuple[float, float, int] = (0.0, 0.0, 1)
    # optimizer steps of one rollout: mini-batches x passes
    steps_per_rollout: int = 1
    curve: list[tuple[float, float, float]] = field(default_factory=list)
    samples: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    train_started: float | None = None
    _steps: int = 0
    _pending: tuple[float, float, int, int] | None = None

    def reward(self, prompts, completions, completion_ids, answer, **_) -> list[float]:
        rewards = [
            score(self.tokenizer.decode(ids, skip_special_tokens=False), str(ans))
            for ids, ans in zip(completion_ids, answer, strict=True)
        ]
        exact = sum(r >= EXACT_REWARD for r in rewards) / len(rewards)
        n_tokens = sum(len(ids) for ids in completion_ids)
        self._pending = (sum(rewards) / len(rewards), exact, len(rewards), n_tokens)
        return rewards

    def step_ended(self) -> bool:
        """Record the rollout whose last optimizer step just finished; True when training should stop."""
        self._steps += 1
        if self._steps % self.steps_per_rollout:
            return time.monotonic() - self.started >= self.max_time_s
        if self._pending is None:
            raise RuntimeError("a TRL rollout ended without being scored")
        reward_mean, exact, n_samples, n_tokens = self._pending
        self._pending = None
        elapsed = time.monotonic() - self.started
        self.curve.append((elapsed, reward_mean, exact))
        self.samples.append(n_samples)
        self.tokens.append(n_tokens)
        reached = self.stop_at_target and time_to_target(self.curve, *self.target) is not None
        return elapsed >= self.max_time_s or reached

    def summary(self) -> dict:
        end = self.curve[-1][0] if self.curve else 0.0
        train_s = max(end - ((self.train_started or self.started) - self.started), 1e-9)
        return {
            "curve": list(self.curve),
            "time_to_target_s": time_to_target(self.curve, *self.target),
            "samples_per_s": sum(self.samples) / train_s,
            "tokens_per_s": sum(self.tokens) / train_s,
            "setup_s": (self.train_started or self.started) - self.started,
            "steps": len(self.curve),
        }


def run_trl(
    seed: int,
    max_time_s: float,
    workdir,
    stop_at_target: bool = False,
    overrides: Sequence[str] = (),
    task: Task = DEMO,
) -> dict:
    """Train with TRL's GRPOTrainer for ``max_time_s`` seconds; returns the per-step curve and throughput.

        The clock starts after the warmed demo policy is built (a one-time cost
        shared with streamrl) and includes TRL's own setup: loading the model,
        building the trainer. ``overrides`` are dotted keys of the preset (``learner.lr=6e-4``)
    for the hyper-parameters TRL shares with it; ``task`` picks the preset, policy and prompts
    (the long-tail task's prompts have different lengths: TRL left-pads them). ``samples_per_s`` / ``tokens_per_s`` count
        completions and completion tokens (EOS included) over the training loop,
        setup excluded.
    """
    import torch

    torch.set_num_threads(1)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    workdir = Path(workdir)
    policy = task.build_policy(workdir / "policy", seed=seed)
    data = task.write_dataset(workdir / "data" / "train.jsonl", seed=seed)

    from datasets import load_dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    started = time.monotonic()
    tokenizer = AutoTokenizer.from_pretrained(policy)
    kwargs = grpo_config_kwargs(seed, str(workdir / "trl"), task.config, overrides)
    recorder = StepRecorder(
        tokenizer,
        started,
        max_time_s,
        stop_at_target,
        task.target(),
        kwargs["steps_per_generation"] * kwargs["num_iterations"],
    )

    class Clock(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            recorder.train_started = time.monotonic()

        def on_step_end(self, args, state, control, **kwargs):
            if recorder.step_ended():
                control.should_training_stop = True

    trainer = GRPOTrainer(
        model=str(policy),
        reward_funcs=recorder.reward,
        args=GRPOConfig(**kwargs),
        train_dataset=load_dataset("json", data_files=str(data), split="train"),
        processing_class=tokenizer,
        callbacks=[Clock()],
    )
    trainer.train()
    return recorder.summary()
