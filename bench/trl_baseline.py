"""TRL baseline: Hugging Face TRL's ``GRPOTrainer`` on the CPU demo task, set up like streamrl's demo.

Same warmed tiny Qwen2 and char tokenizer (``actors.demo_task.ensure_demo_policy``),
same prompts (raw ``"314>"`` strings, no chat template), same shaped reward, and
every hyper-parameter TRL has an equivalent for taken from streamrl's demo preset
(``configs/demo_cpu.yaml``, see ``grpo_config_kwargs``): group size, prompts per
step, new tokens, sampling, AdamW lr/betas/weight decay, grad clip, clip range,
k3 KL coefficient to the initial policy, updates per rollout batch, and the
token-mean loss (TRL's ``"dapo"``: normalised by the active tokens of the whole
accumulated batch; with one batch per step that is streamrl's
``aggregation: token_mean``). Zero-variance groups stay in the batch in both
(the preset's ``skip_zero_variance: false``). Transformers ``generate`` on the
CPU with one torch thread. TRL alternates generation and training
synchronously in one process, which is what streamrl is measured against.

    python -m bench.trl_baseline --seed 0 --max-time-s 240 --workdir runs/trl-baseline
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path

from actors.demo_task import EOS, ensure_demo_dataset, ensure_demo_policy, reverse_digits_reward

DEMO_CONFIG = "configs/demo_cpu.yaml"
EXACT_REWARD = 0.999
TARGET_WINDOW, TARGET_REWARD, TARGET_EXACT = 5, 0.9, 0.8


def grpo_config_kwargs(seed: int, output_dir: str, config_path: str = DEMO_CONFIG) -> dict:
    """The exact ``GRPOConfig`` arguments of the baseline (also printed in the benchmark section).

    Everything with a TRL equivalent comes from streamrl's config, so the two
    run the same algorithm as far as TRL allows.
    """
    from configs import load_config

    cfg = load_config(config_path, [], env={})
    r, a, lrn = cfg.rollout, cfg.algo, cfg.learner
    if a.aggregation != "token_mean":
        raise ValueError(
            f"the TRL baseline maps only aggregation=token_mean, not {a.aggregation!r}"
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
        "max_steps": 100_000,  # the time budget stops training, via StepRecorder
        # One optimizer step = one generation batch of groups_per_step prompts x group_size completions.
        "num_generations": r.group_size,
        "per_device_train_batch_size": lrn.groups_per_step * r.group_size,
        "gradient_accumulation_steps": 1,
        "steps_per_generation": 1,
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


def stopped_on_eos(completion_ids: list[int], eos_ids: set[int]) -> bool:
    """TRL cuts each completion after its first EOS and keeps it, so a stop shows as the last id."""
    return bool(completion_ids) and completion_ids[-1] in eos_ids


def score(text: str, completion_ids: list[int], answer: str, eos_ids: set[int]) -> float:
    """The demo reward of one TRL completion: TRL decodes without special tokens, so EOS is re-appended."""
    full = text + (EOS if stopped_on_eos(completion_ids, eos_ids) else "")
    return sum(reverse_digits_reward(full, answer).values())


def time_to_target(
    curve: list[tuple[float, float, float]],
    window: int = TARGET_WINDOW,
    reward: float = TARGET_REWARD,
    exact: float = TARGET_EXACT,
) -> float | None:
    """First elapsed time at which the mean of the last ``window`` steps reaches both targets."""
    for end in range(window, len(curve) + 1):
        recent = curve[end - window : end]
        if (
            sum(r for _, r, _ in recent) / window >= reward
            and sum(e for _, _, e in recent) / window >= exact
        ):
            return curve[end - 1][0]
    return None


@dataclass
class StepRecorder:
    """TRL reward function and step clock in one: scores each batch, stamps it at the step's end."""

    eos_ids: set[int]
    started: float
    max_time_s: float
    stop_at_target: bool = False
    curve: list[tuple[float, float, float]] = field(default_factory=list)
    samples: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    train_started: float | None = None
    _pending: tuple[float, float, int, int] | None = None

    def reward(self, prompts, completions, completion_ids, answer, **_) -> list[float]:
        rewards = [
            score(text, ids, str(ans), self.eos_ids)
            for text, ids, ans in zip(completions, completion_ids, answer, strict=True)
        ]
        exact = sum(r >= EXACT_REWARD for r in rewards) / len(rewards)
        n_tokens = sum(len(ids) for ids in completion_ids)
        self._pending = (sum(rewards) / len(rewards), exact, len(rewards), n_tokens)
        return rewards

    def step_ended(self) -> bool:
        """Record the step just finished; True when training should stop."""
        if self._pending is None:
            raise RuntimeError("a TRL step ended without scoring a batch")
        reward_mean, exact, n_samples, n_tokens = self._pending
        self._pending = None
        elapsed = time.monotonic() - self.started
        self.curve.append((elapsed, reward_mean, exact))
        self.samples.append(n_samples)
        self.tokens.append(n_tokens)
        reached = self.stop_at_target and time_to_target(self.curve) is not None
        return elapsed >= self.max_time_s or reached

    def summary(self) -> dict:
        end = self.curve[-1][0] if self.curve else 0.0
        train_s = max(end - ((self.train_started or self.started) - self.started), 1e-9)
        return {
            "curve": list(self.curve),
            "time_to_target_s": time_to_target(self.curve),
            "samples_per_s": sum(self.samples) / train_s,
            "tokens_per_s": sum(self.tokens) / train_s,
            "setup_s": (self.train_started or self.started) - self.started,
            "steps": len(self.curve),
        }


def run_trl(seed: int, max_time_s: float, workdir, stop_at_target: bool = False) -> dict:
    """Train with TRL's GRPOTrainer for ``max_time_s`` seconds; returns the per-step curve and throughput.

    The clock starts after the warmed demo policy is built (a one-time cost
    shared with streamrl) and includes TRL's own setup: loading the model,
    building the trainer. ``samples_per_s`` / ``tokens_per_s`` count
    completions and completion tokens (EOS included) over the training loop,
    setup excluded.
    """
    import torch

    torch.set_num_threads(1)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    workdir = Path(workdir)
    policy = ensure_demo_policy(workdir / "policy", seed=seed)
    data = ensure_demo_dataset(workdir / "data" / "train.jsonl", seed=seed)

    from datasets import load_dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    started = time.monotonic()
    tokenizer = AutoTokenizer.from_pretrained(policy)
    recorder = StepRecorder({tokenizer.eos_token_id}, started, max_time_s, stop_at_target)

    class Clock(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            recorder.train_started = time.monotonic()

        def on_step_end(self, args, state, control, **kwargs):
            if recorder.step_ended():
                control.should_training_stop = True

    trainer = GRPOTrainer(
        model=str(policy),
        reward_funcs=recorder.reward,
        args=GRPOConfig(**grpo_config_kwargs(seed, str(workdir / "trl"))),
        train_dataset=load_dataset("json", data_files=str(data), split="train"),
        processing_class=tokenizer,
        callbacks=[Clock()],
    )
    trainer.train()
    return recorder.summary()


def markdown(result: dict, seed: int, max_time_s: float, command: str) -> str:
    import torch
    import transformers
    import trl

    curve = result["curve"]
    last = curve[-TARGET_WINDOW:]
    ttt = result["time_to_target_s"]
    rows = []
    every = max(10, round(len(curve) / 200) * 10)  # about 20 rows, at round step numbers
    marks = sorted({0, *range(every - 1, len(curve), every), len(curve) - 1}) if curve else []
    for i in marks:
        t, r, e = curve[i]
        rows.append(f"| {i + 1} | {t:.1f} | {r:.3f} | {e:.2f} |")
    return "\n".join(
        [
            "## TRL GRPOTrainer baseline",
            "",
            f"{time.strftime('%Y-%m-%d %H:%M')} · {platform.node()} ({platform.machine()}, {os.cpu_count()} cores) · "
            f"trl {trl.__version__}, transformers {transformers.__version__}, torch {torch.__version__}, 1 thread · `{command}`",
            "",
            "TRL's synchronous generate-then-train loop on the demo task (warmed ~0.5M-parameter Qwen2, "
            f"reverse 3 digits), with every hyper-parameter TRL has taken from `{DEMO_CONFIG}` "
            "(the GRPOConfig below): token-mean loss (`loss_type=dapo`), `(r − mean)/(std + ε)` per group, "
            "the same clip range, k3 KL coefficient to the initial policy, lr and updates per batch. "
            f"Seed {seed}, time cap {max_time_s:.0f} s; the clock includes TRL's setup "
            f"({result['setup_s']:.1f} s) and excludes the one-time warm start of the policy.",
            "",
            "| result | value |",
            "|---|---|",
            f"| optimizer steps | {result['steps']} |",
            f"| time to target (5-step mean reward ≥ {TARGET_REWARD}, exact ≥ {TARGET_EXACT}) | "
            + (f"**{ttt:.1f} s**" if ttt is not None else f"not reached in {max_time_s:.0f} s")
            + " |",
            f"| last {len(last)} steps: mean reward / exact match | "
            + (
                f"{sum(r for _, r, _ in last) / len(last):.3f} / {sum(e for _, _, e in last) / len(last):.2f}"
                if last
                else "–"
            )
            + " |",
            f"| samples/s (training loop) | {result['samples_per_s']:.1f} |",
            f"| completion tokens/s (training loop) | {result['tokens_per_s']:.1f} |",
            "",
            "| step | elapsed s | mean reward | exact match |",
            "|---|---|---|---|",
            *rows,
            "",
            "<details><summary>GRPOConfig used</summary>",
            "",
            "```json",
            json.dumps(grpo_config_kwargs(seed, "<workdir>/trl"), indent=1),
            "```",
            "",
            "</details>",
        ]
    )


def run(quick: bool = False) -> str:
    """Benchmark section: one seed, stop at the target or the time cap."""
    import tempfile

    max_time_s = 60.0 if quick else 480.0
    with tempfile.TemporaryDirectory(prefix="trl-baseline-") as workdir:
        result = run_trl(0, max_time_s, workdir, stop_at_target=True)
    return markdown(result, 0, max_time_s, "make bench" + (" --quick" if quick else ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-time-s", type=float, default=240.0)
    parser.add_argument("--workdir", default="runs/trl-baseline")
    parser.add_argument("--stop-at-target", action="store_true")
    parser.add_argument("--json", help="also write the result dict here")
    args = parser.parse_args()
    result = run_trl(args.seed, args.max_time_s, args.workdir, args.stop_at_target)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    command = f"python -m bench.trl_baseline --seed {args.seed} --max-time-s {args.max_time_s:g}"
    print(markdown(result, args.seed, args.max_time_s, command))


if __name__ == "__main__":
    main()
