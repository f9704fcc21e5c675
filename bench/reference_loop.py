"""The reference loop: a plain synchronous GRPO loop in one process, on the demo task of ``make run``
(``bench.longtail`` holds it to the yardstick, the one-file loop ``bench/yardstick/grpo_toy.py``).

    python -m bench.reference_loop --seed 0 [--task demo|longtail] [--carry-optimizer] [--lag N] \\
        [--max-rollouts N] [dotted.key=value ...]

Sample a batch on the current weights, score it, train on it, repeat: no
broker, no actors, no DeepSpeed, nothing overlapped. Same warmed tiny Qwen2,
char tokenizer, prompts (the shared dataset order of ``actors.prompt_data``),
reward (``streamrl.examples.reverse_digits``, on the text with special tokens) and
hyper-parameters as streamrl (``configs/demo_cpu.yaml``, or with ``--task
longtail`` ``configs/longtail_cpu.yaml`` and its task, plus the same overrides): groups_per_step prompts x group_size completions per rollout,
``(r - mean) / (std + eps)`` per group, token-level clipped ratio against the
sampling log-probs, optional k3 KL to the warmed policy, ``minibatches``
disjoint random mini-batches per pass (one AdamW step each, the token mean of
the mini-batch), ``updates_per_batch`` passes, grad clip, AdamW. It is the
textbook loop, written out here rather than reusing ``learner``, so that the
system is measured against an independent implementation. Prompts of different
lengths (the long-tail task) are left-padded, with an attention mask and position ids,
and the whole rollout decodes until its longest completion stops, as a batched
``generate`` does.

Optimizer: by default a fresh AdamW on the warmed policy folder, as the
streamrl learner starts; ``--carry-optimizer`` instead runs the format warm
start in this process (same seed: the same warmed weights) and keeps its AdamW,
moments included, for RL, as the yardstick (``bench/yardstick/grpo_toy.py``) does.

Staleness: ``--lag N`` samples each rollout with the weights of N optimizer
steps earlier (the first rollouts with the warmed policy) and trains with the
decoupled objective streamrl uses for stale tokens: the ratio and its clip
against the current policy at the rollout's start, times the importance weight
``min(exp(pi_prox - mu), rho_max)`` (with ``algo.proximal=behaviour``, as in
streamrl, the ratio against the sampling policy and no weight). It measures
what staleness alone costs the learning per sample, with no system around it;
``--lag 0`` is the plain loop.

Clock: from the start of the process's work (policy load, or for
``--carry-optimizer`` the end of the warm start, which the other systems get
prebuilt). The rollout curve has one point per rollout, stamped when its last
optimizer step ends.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import random
import sys
import tempfile
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import DynamicCache

from bench.tasks import DEMO, TASKS, Task
from streamrl.actors.engines.hf.engine import cache_kwarg
from streamrl.actors.prompt_data import position
from streamrl.examples.reverse_digits.rewards import reverse_digits_reward
from streamrl.examples.reverse_digits.task import build_model, build_tokenizer
from streamrl.learner import target

CONFIG = DEMO.config
EXACT_PART = DEMO.exact_part
EXACT_REWARD = 0.999


def left_pad(
    prompts: list[list[int]], pad: int, device: str | torch.device = "cpu"
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Token lists -> ids [N, P] right-aligned, and the mask of real tokens (None: one length)."""
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=device)
    if all(len(p) == width for p in prompts):
        return ids, None
    mask = torch.tensor(
        [[False] * (width - len(p)) + [True] * len(p) for p in prompts], device=device
    )
    return ids, mask


def _masked(mask: torch.Tensor | None) -> dict:
    """Attention mask and position ids for left-padded rows; nothing when every row is full."""
    if mask is None:
        return {}
    return {"attention_mask": mask.long(), "position_ids": (mask.long().cumsum(1) - 1).clamp(min=0)}


@torch.no_grad()
def sample(
    model,
    prompt_ids,
    max_new: int,
    eos: int,
    pad: int,
    temperature: float,
    prompt_mask: torch.Tensor | None = None,
):
    """prompt_ids [N, P] (left-padded where ``prompt_mask`` says) -> completions [N, T] (pad after
    EOS), behaviour log-probs [N, T]."""
    # the cache fills in place, so no version-specific output field is read
    cache = {cache_kwarg(model): DynamicCache(config=model.config)}
    extra = _masked(prompt_mask)
    logits = model(input_ids=prompt_ids, use_cache=True, **cache, **extra).logits[:, -1]
    tokens, logprobs = [], []
    done = torch.zeros(prompt_ids.shape[0], dtype=torch.bool, device=prompt_ids.device)
    for t in range(max_new):
        logp = torch.log_softmax(logits.float() / temperature, -1)
        nxt = torch.multinomial(logp.exp(), 1).squeeze(-1)
        lp = logp.gather(-1, nxt[:, None]).squeeze(-1)
        nxt = torch.where(done, torch.full_like(nxt, pad), nxt)
        tokens.append(nxt)
        logprobs.append(torch.where(done, torch.zeros_like(lp), lp))
        done = done | (nxt == eos)
        if bool(done.all()) or t == max_new - 1:
            break
        if extra:
            mask = torch.cat([extra["attention_mask"], torch.ones_like(nxt)[:, None]], 1)
            extra = {"attention_mask": mask, "position_ids": extra["position_ids"][:, -1:] + 1}
        logits = model(input_ids=nxt[:, None], use_cache=True, **cache, **extra).logits[:, -1]
    return torch.stack(tokens, 1), torch.stack(logprobs, 1)


def completion_mask(completions, eos: int):
    """True up to and including the first EOS."""
    is_eos = (completions == eos).int()
    return (is_eos.cumsum(1) - is_eos) == 0


def token_logprobs(model, prompt_ids, completions, temperature: float, prompt_mask=None):
    ids = torch.cat([prompt_ids, completions], 1)
    mask = None
    if prompt_mask is not None:
        mask = torch.cat([prompt_mask, torch.ones_like(completions, dtype=torch.bool)], 1)
    logits = model(input_ids=ids, **_masked(mask)).logits[:, prompt_ids.shape[1] - 1 : -1]
    logits = logits.float() / temperature
    return torch.log_softmax(logits, -1).gather(-1, completions[..., None]).squeeze(-1)


def score(tokenizer, completion: list[int], eos: int, answer: str) -> float:
    """The demo reward on what the model wrote, special tokens included, up to and with EOS."""
    if eos in completion:
        completion = completion[: completion.index(eos) + 1]
    text = tokenizer.decode(completion, skip_special_tokens=False)
    return sum(reverse_digits_reward(text, answer).values())


def load_rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.open() if line.strip()]


@dataclass
class Rollout:
    """One rollout as the loop learns from it: prompts [N, P] (left-padded where ``prompt_mask``
    says), completions [N, T] padded after their end of sequence, the mask of their real tokens,
    the sampling log-probs [N, T], the group-normalised advantages [N] and, with a KL term, the
    reference policy's log-probs [N, T]."""

    prompts: torch.Tensor
    prompt_mask: torch.Tensor | None
    completions: torch.Tensor
    mask: torch.Tensor
    old_lp: torch.Tensor
    adv: torch.Tensor
    ref_lp: torch.Tensor | None = None


def group_advantages(reward: torch.Tensor, groups: int, algo) -> torch.Tensor:
    """Rewards [groups x G] (float64) -> advantages (float32): ``r - mean`` per group, divided by
    ``std + adv_eps`` under ``algo.advantage: grpo``."""
    grouped = reward.view(groups, -1)
    centred = grouped - grouped.mean(1, keepdim=True)
    if algo.advantage == "grpo":
        centred = centred / (grouped.std(1, unbiased=False, keepdim=True) + algo.adv_eps)
    return centred.view(-1).float()


def clipped_loss(lp, prox_lp, adv, mask, algo, ref_lp=None, weight=None) -> torch.Tensor:
    """The loop's loss on one mini-batch: minus the token mean of the clipped ratio objective
    against ``prox_lp`` (times the importance ``weight``, if any), less ``kl_coef`` times the k3
    KL to ``ref_lp`` (if any)."""
    ratio = torch.exp(lp - prox_lp)
    clipped = ratio.clamp(1 - algo.clip_low, 1 + algo.clip_high)
    obj = torch.minimum(ratio * adv[:, None], clipped * adv[:, None])
    if weight is not None:
        obj = weight * obj
    if ref_lp is not None:
        d = ref_lp - lp
        obj = obj - algo.kl_coef * (torch.exp(d) - d - 1)
    return -(obj * mask).sum() / mask.sum()


def learn(model, optimizer, cfg, batch: Rollout, prox_lp, weight=None, after_step=None) -> None:
    """The loop's learn half: ``updates_per_batch`` passes over ``minibatches`` disjoint random
    mini-batches of ``batch``, one AdamW step each (gradient clipped to ``grad_clip``), then
    ``after_step()``."""
    a, lrn = cfg.algo, cfg.learner
    parts = torch.randperm(len(batch.adv), device=batch.adv.device).chunk(lrn.minibatches)
    for _ in range(lrn.updates_per_batch):
        for mb in parts:
            mb_mask = None if batch.prompt_mask is None else batch.prompt_mask[mb]
            lp = token_logprobs(
                model, batch.prompts[mb], batch.completions[mb], cfg.rollout.temperature, mb_mask
            )
            loss = clipped_loss(
                lp,
                prox_lp[mb],
                batch.adv[mb],
                batch.mask[mb],
                a,
                None if batch.ref_lp is None else batch.ref_lp[mb],
                None if weight is None else weight[mb],
            )
            optimizer.zero_grad()
            loss.backward()
            if lrn.grad_clip:
                torch.nn.utils.clip_grad_norm_(model.parameters(), lrn.grad_clip)
            optimizer.step()
            if after_step is not None:
                after_step()


def _adamw(model, lrn) -> torch.optim.AdamW:
    return torch.optim.AdamW(
        model.parameters(), lr=lrn.lr, betas=tuple(lrn.betas), weight_decay=lrn.weight_decay
    )


def _start(task: Task, policy_dir: Path, seed: int, lrn, carry_optimizer: bool, device: str):
    """(tokenizer, model, optimizer, the clock's start): the warmed policy loaded from
    ``policy_dir`` with a fresh AdamW, or with ``carry_optimizer`` warmed here on its AdamW."""
    from streamrl.policy.load import load_policy, load_tokenizer

    if carry_optimizer:
        tokenizer = build_tokenizer()
        model = build_model(len(tokenizer), tokenizer.eos_token_id, tokenizer.pad_token_id, seed)
        model.to(device)
        optimizer = _adamw(model, lrn)
        task.warm_start(model, tokenizer, seed, optimizer)
        for group in optimizer.param_groups:
            group["lr"] = lrn.lr
        torch.manual_seed(seed)
        return tokenizer, model, optimizer, time.monotonic()
    policy = task.build_policy(policy_dir, seed=seed)
    started = time.monotonic()
    tokenizer = load_tokenizer(policy)
    model = load_policy(policy).to(device=device, dtype=torch.float32)
    return tokenizer, model, _adamw(model, lrn), started


def _frozen_copy(model, device: str):
    """The policy as it is now, for the k3 KL's reference log-probs."""
    ref = type(model)(model.config).to(device)
    ref.load_state_dict(model.state_dict())
    return ref.eval().requires_grad_(False)


def _sample_rollout(cfg, model, sampler, ref, tokenizer, batch: list[dict], device: str):
    """Sample ``batch``'s prompts ``group_size`` times each with ``sampler``, score them and, with
    a reference policy ``ref``, take its log-probs: the rollout and its rewards (float64)."""
    r = cfg.rollout
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    prompts, prompt_mask = left_pad(
        [tokenizer(b["prompt"])["input_ids"] for b in batch], pad, device
    )
    prompts = prompts.repeat_interleave(r.group_size, 0)
    if prompt_mask is not None:
        prompt_mask = prompt_mask.repeat_interleave(r.group_size, 0)
    answers = [b["answer"] for b in batch for _ in range(r.group_size)]
    model.eval()
    completions, old_lp = sample(
        sampler, prompts, r.max_new_tokens, eos, pad, r.temperature, prompt_mask
    )
    model.train()
    mask = completion_mask(completions, eos).float()
    reward = torch.tensor(
        [
            score(tokenizer, c.tolist(), eos, ans)
            for c, ans in zip(completions, answers, strict=True)
        ],
        dtype=torch.float64,
        device=device,
    )
    adv = group_advantages(reward, len(batch), cfg.algo)
    ref_lp = token_logprobs(ref, prompts, completions, r.temperature, prompt_mask) if ref else None
    return Rollout(prompts, prompt_mask, completions, mask, old_lp, adv, ref_lp), reward


def _proximal(cfg, model, batch: Rollout, lag: int):
    """(pi_prox, the importance weight): with a lag (and ``algo.proximal: recompute``) the policy at
    the rollout's start and ``min(exp(pi_prox - mu), rho_max)``; otherwise (no lag, or the plain
    PPO ratio of ``proximal: behaviour``) the sampling policy itself and a weight of 1."""
    a = cfg.algo
    if not (lag and a.proximal == "recompute"):
        return batch.old_lp, torch.ones_like(batch.old_lp)
    with torch.no_grad():
        prox_lp = token_logprobs(
            model, batch.prompts, batch.completions, cfg.rollout.temperature, batch.prompt_mask
        )
    prox_lp = torch.where(batch.mask.bool(), prox_lp, batch.old_lp)
    return prox_lp, torch.exp(prox_lp - batch.old_lp).clamp(max=a.rho_max)


class _Lagged:
    """The weights each rollout samples with: the policy itself, or with a ``lag`` its weights of
    ``lag`` optimizer steps earlier (the warmed policy's for the first rollouts)."""

    def __init__(self, model, lag: int):
        self.model, self.lag = model, lag
        # the policy's weights at the last lag + 1 versions, oldest first: history[0] samples
        self.history: deque = deque(maxlen=lag + 1)
        self.copy = None
        if lag:
            self.copy = copy.deepcopy(model).eval().requires_grad_(False)
            self.history.append(copy.deepcopy(model.state_dict()))

    def sampler(self):
        if not self.lag:
            return self.model
        self.copy.load_state_dict(self.history[0])
        return self.copy

    @property
    def after_step(self):
        """What ``learn`` calls after each optimizer step: keep the new weights (with a lag)."""
        if not self.lag:
            return None
        return lambda: self.history.append(copy.deepcopy(self.model.state_dict()))


def _summary(curve, seen, run, setup_s, samples, tokens, cpu_s) -> dict:
    """The result's figures: time and rollouts to the target, the last window's means, throughput."""
    end = target.first_reached(seen, target.bars(run), run.target_window)
    last = curve[-run.target_window :]
    loop_s = curve[-1][0] - setup_s if curve else 0.0
    return {
        "curve": curve,
        "steps": len(curve),
        "setup_s": setup_s,
        "time_to_target_s": None if end is None else curve[end][0],
        "rollouts_to_target": None if end is None else end + 1,
        # means of reward and exact match over the target's window of last rollouts (None: no rollout)
        "last_window": (
            (sum(p[1] for p in last) / len(last), sum(p[2] for p in last) / len(last))
            if last
            else None
        ),
        "samples_per_s": samples / loop_s if loop_s > 0 else 0.0,
        "samples_per_cpu_s": samples / max(cpu_s, 1e-9),
        "tokens_per_s": tokens / loop_s if loop_s > 0 else 0.0,
    }


def run_reference(
    seed: int,
    max_time_s: float,
    workdir,
    overrides: list[str] | tuple[str, ...] = (),
    carry_optimizer: bool = False,
    stop_at_target: bool = True,
    lag: int = 0,
    echo=print,
    max_rollouts: int | None = None,
    task: Task = DEMO,
    device: str = "cpu",
) -> dict:
    """Train until the preset's target, ``max_time_s`` or ``max_rollouts``; the per-rollout curve and
    throughput. ``device``: where the whole loop runs (the warm start, sampling and learning), in
    float32 as on the CPU."""
    from streamrl.configs import load_config

    torch.set_num_threads(1)
    cfg = load_config(task.config, list(overrides), env={})
    lrn, run = cfg.learner, cfg.run
    workdir = Path(workdir)
    data = task.write_dataset(workdir / "data" / "train.jsonl", seed=seed)
    random.seed(seed)
    torch.manual_seed(seed)
    tokenizer, model, optimizer, started = _start(
        task, workdir / "policy", seed, lrn, carry_optimizer, device
    )
    ref = _frozen_copy(model, device) if cfg.algo.kl_coef > 0 else None
    lagged = _Lagged(model, lag)
    rows = load_rows(data)
    cursor = 0
    curve, samples, tokens = [], 0, 0
    setup_s = time.monotonic() - started
    # CPU seconds of this process: on a shared machine they move far less than wall time
    cpu_started = time.process_time()
    # each rollout's figures for run.target_* (learner.target), as the learner's step rows give them
    seen = []
    step = 0
    while time.monotonic() - started < max_time_s and (max_rollouts is None or step < max_rollouts):
        t0 = time.monotonic()
        batch = [
            rows[position(cursor + i, len(rows), run.seed)[1]] for i in range(lrn.groups_per_step)
        ]
        cursor += lrn.groups_per_step
        rollout, reward = _sample_rollout(
            cfg, model, lagged.sampler(), ref, tokenizer, batch, device
        )
        prox_lp, weight = _proximal(cfg, model, rollout, lag)
        gen_s = time.monotonic() - t0
        learn(model, optimizer, cfg, rollout, prox_lp, weight, lagged.after_step)
        now = time.monotonic() - started
        samples += len(reward)
        tokens += int(rollout.mask.sum())
        exact = float((reward >= EXACT_REWARD).float().mean())
        curve.append((now, float(reward.mean()), exact))
        seen.append({target.REWARD: float(reward.mean()), task.exact_part: exact})
        if step % 25 == 0:
            echo(
                f"rollout {step:4d} t={now:6.1f}s reward {reward.mean():.3f} exact {exact:.3f} "
                f"gen {gen_s * 1e3:.0f} ms learn {(time.monotonic() - t0 - gen_s) * 1e3:.0f} ms"
            )
        step += 1
        if stop_at_target and target.window_reached(seen, target.bars(run), run.target_window):
            break
    return {
        **_summary(curve, seen, run, setup_s, samples, tokens, time.process_time() - cpu_started),
        "carry_optimizer": carry_optimizer,
        "lag": lag,
        "overrides": list(overrides),
        "task": task.name,
    }


def _last_window(result: dict) -> str:
    if result["last_window"] is None:
        return "–"
    reward, exact = result["last_window"]
    return f"{reward:.3f} / {exact:.2f}"


def markdown(results: list[dict], seeds: list[int], cap_s: float, command: str) -> str:
    """The benchmark section: the loop's rollouts and time to the preset's target, per optimizer start."""
    import datetime
    import os
    import platform

    from streamrl.configs import load_config

    run = load_config(CONFIG, [], env={}).run
    rows = []
    for r in results:
        ttt = r["time_to_target_s"]
        rows.append(
            f"| {r['seed']} | {' '.join(r['overrides']) or 'preset'} | "
            f"{'carried from the warm start' if r['carry_optimizer'] else 'fresh'} | "
            f"{r['rollouts_to_target'] or f'not in {cap_s:.0f} s'} | "
            f"{'–' if ttt is None else f'{ttt:.0f} s'} | {len(r['curve'])} | "
            f"{_last_window(r)} | {r['samples_per_s']:.0f} | "
            f"{r.get('samples_per_cpu_s', math.nan):.0f} |"
        )
    return "\n".join(
        [
            "## Reference loop: plain synchronous GRPO in one process",
            "",
            f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC · {platform.node()} "
            f"({os.cpu_count()} cores, shared with whatever else runs) · 1 torch thread · `{command}`",
            "",
            "`bench.reference_loop`: sample a 256-completion rollout, score it, train on it, repeat, with the "
            f"recipe of `{CONFIG}` on the demo's policy, prompts and reward. Target: {run.target_window}-rollout "
            f"means of reward ≥ {run.target_reward} and exact match ≥ {run.target_parts.get(EXACT_PART, 0.0)}; cap {cap_s:.0f} s. "
            f"Seeds {', '.join(map(str, seeds))} (warm-start seed = RL seed). Optimizer: *fresh* = a new AdamW on "
            "the warmed policy, as the streamrl learner starts; *carried* = the warm start's AdamW, moments "
            "included, kept for RL.",
            "",
            "| seed | overrides | AdamW | rollouts to target | time to target | rollouts run "
            f"| last {run.target_window} rollouts: reward / exact | samples/s | samples per CPU-second |",
            "|---|---|---|---|---|---|---|---|---|",
            *rows,
        ]
    )


def run(quick: bool = False) -> str:
    """Benchmark section (``make bench``): seed 0 (quick) or 0-2, fresh and carried optimizer."""
    seeds = [0] if quick else [0, 1, 2]
    cap_s = 300.0 if quick else 600.0
    results = []
    for seed in seeds:
        with tempfile.TemporaryDirectory(prefix="reference-loop-") as tmp:
            for carry in (False, True):
                result = run_reference(seed, cap_s, tmp, (), carry, echo=lambda line: None)
                results.append({**result, "seed": seed})
    return markdown(results, seeds, cap_s, "make bench" + (" --quick" if quick else ""))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--task", choices=sorted(TASKS), default=DEMO.name)
    parser.add_argument("--max-time-s", type=float, default=600.0)
    parser.add_argument("--workdir", default=None, help="policy/data folder (default: a temp dir)")
    parser.add_argument("--carry-optimizer", action="store_true")
    parser.add_argument(
        "--lag",
        type=int,
        default=0,
        help="sample with the weights of this many optimizer steps ago",
    )
    parser.add_argument(
        "--max-rollouts", type=int, default=None, help="stop after this many rollouts"
    )
    parser.add_argument("--device", default="cpu", help="torch device of the whole loop")
    parser.add_argument("--json", help="also write the result here")
    parser.add_argument("overrides", nargs="*", help="dotted.key=value on the task's preset")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="reference-loop-") as tmp:
        result = run_reference(
            args.seed,
            args.max_time_s,
            args.workdir or tmp,
            args.overrides,
            args.carry_optimizer,
            lag=args.lag,
            max_rollouts=args.max_rollouts,
            task=TASKS[args.task],
            device=args.device,
        )
    if args.json:
        Path(args.json).write_text(json.dumps(result))
    print(
        f"FINAL rollouts={result['steps']} rollouts_to_target={result['rollouts_to_target']} "
        f"time_to_target={result['time_to_target_s']} last_window={_last_window(result)} "
        f"samples/s={result['samples_per_s']:.0f} samples/cpu-s={result['samples_per_cpu_s']:.0f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
