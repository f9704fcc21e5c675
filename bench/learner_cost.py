"""Learner cost per step and its tokens/s, on the demo batch and on a long-tail batch, against the
reference loop's learn half on the same samples.

    python -m bench.learner_cost [--steps N]    # prints the section of docs/bench/learner_cost.md

The learner side is the real thing on one rank: ``GRPO.train_next`` on the CPU demo config
(``configs/demo_cpu.yaml``: 16 groups x 16 completions per step, one update per batch, shm weight
publishing, metrics served) reading pre-filled groups from a real Redis stream. Rewards are drawn
per completion, so no group is left out as zero-variance (16 equal draws: odds ~1e-9). With a KL
term under ``algo.reference_on: actors`` the groups carry the reference log-probs, as the actors
send them, and the learner runs no reference forward. Each step is split into phases by timing the
learner's own methods: read + prepare (stream, decode, advantages), reference forward,
forward+backward, optimizer, publish (weights + version + admission count), record (step row,
metrics) and checkpoint/ack.

The reference is one rollout of the plain synchronous loop the demo recipe comes from
(``bench.reference_loop``: one process, sample, score, learn): on the demo task, sampling 16
prompts x 16 completions of 4 tokens (3 digits + end of sequence, what a trained policy writes)
with a KV cache at temperature 1; on both tasks the loop's learn half on the same 256 samples as
the learner, scored by the loop's own ``token_logprobs`` with completions padded to the batch's
longest (as the loop samples them): a reference-model forward when KL is on, then two clipped
token-mean AdamW updates on disjoint halves of 128, gradient clipping 1.0, plain torch, no Redis.
Learner and reference run alternately in one process, so load from other processes hits both
alike: report ratios, not absolute times.

Tasks: ``demo``, 2-5 token completions (1-4 digits + end of sequence); ``longtail``, completion
lengths 1-24 tokens drawn with P(k) proportional to k^-1.2 (median 3, mean ~5.3: the batch's
longest is ~7x its median, as in reasoning traces), ``rollout.max_new_tokens=24``. The learner's
tokens/s counts the prompt + completion tokens it trained per second of its whole step.
"""

from __future__ import annotations

import asyncio
import datetime
import os
import platform
import random
import statistics
import tempfile
import time
import uuid
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch

CONFIG = "configs/demo_cpu.yaml"
LONGTAIL_MAX = 24
LONGTAIL_EXPONENT = 1.2
TASKS = {
    # completion length in tokens (end of sequence included), at most the run's
    # rollout.max_new_tokens (``cap``: the learner refuses longer ones), and the overrides the task needs
    "demo": (lambda rng, cap: rng.randint(2, cap), []),
    "longtail": (
        lambda rng, cap: rng.choices(
            range(1, cap + 1), [k**-LONGTAIL_EXPONENT for k in range(1, cap + 1)]
        )[0],
        [f"rollout.max_new_tokens={LONGTAIL_MAX}"],
    ),
}
PHASES = [
    "read+prepare",
    "reference forward",
    "forward+backward",
    "optimizer",
    "publish",
    "record",
    "checkpoint+ack",
]


def _groups(
    tokenizer,
    n: int,
    group_size: int,
    version: int,
    rng: random.Random,
    with_ref: bool,
    length,
    cap: int,
):
    """Demo-shaped groups: a reverse-3-digits prompt, completions of ``length(rng, cap)`` tokens
    (digits + end of sequence), mixed rewards; ``with_ref``: with reference log-probs, as actors
    send them under ``algo.reference_on: actors``."""
    from streamrl.broker.wire import Completion, RolloutGroup
    from streamrl.examples.reverse_digits.task import make_example

    eos = tokenizer.eos_token_id
    digits = [tokenizer.convert_tokens_to_ids(d) for d in "0123456789"]
    out = []
    for g in range(n):
        prompt = tokenizer(make_example(rng)["prompt"])["input_ids"]
        completions = []
        for _ in range(group_size):
            tokens = [rng.choice(digits) for _ in range(length(rng, cap) - 1)] + [eos]
            completions.append(
                Completion(
                    token_ids=np.array(tokens, dtype=np.int32),
                    logprobs=-np.array([rng.random() * 2 for _ in tokens], dtype=np.float32),
                    versions=np.full(len(tokens), version, dtype=np.int32),
                    reward=rng.choice([0.0, 0.3, 0.6, 1.0]),
                    ref_logprobs=-np.array([rng.random() * 2 for _ in tokens], dtype=np.float32)
                    if with_ref
                    else None,
                )
            )
        out.append(
            RolloutGroup(
                group_id=uuid.uuid4().hex,
                prompt_id=str(g),
                actor_id="bench",
                seq=g,
                prompt_token_ids=np.array(prompt, dtype=np.int32),
                completions=completions,
            )
        )
    return out


class _Timer:
    """Wraps an object's methods so each call's time lands in a phase (bench instrumentation)."""

    def __init__(self):
        self.seconds: dict[str, float] = defaultdict(float)

    def wrap(self, obj, name: str, phase: str) -> None:
        inner = getattr(obj, name)

        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                self.seconds[phase] += time.perf_counter() - t0

        setattr(obj, name, timed)


def _loop_tensors(groups, cfg, eos: int, pad: int):
    """The reference loop's view of a batch (``bench.reference_loop.Rollout``): prompts [N, P],
    completions [N, T] padded after the end of sequence to the batch's longest, their mask,
    sampling log-probs [N, T] and the group-normalised advantages."""
    from bench.reference_loop import Rollout, completion_mask, group_advantages

    width = max(len(c.token_ids) for g in groups for c in g.completions)
    prompts, completions, old_lp, rewards = [], [], [], []
    for g in groups:
        for c in g.completions:
            prompts.append(g.prompt_token_ids.tolist())
            n = len(c.token_ids)
            completions.append(c.token_ids.tolist() + [pad] * (width - n))
            old_lp.append(c.logprobs.tolist() + [0.0] * (width - n))
            rewards.append(c.reward)
    adv = group_advantages(torch.tensor(rewards, dtype=torch.float64), len(groups), cfg.algo)
    completions = torch.tensor(completions)
    mask = completion_mask(completions, eos).float()
    return Rollout(torch.tensor(prompts), None, completions, mask, torch.tensor(old_lp), adv)


def _reference_learn(model, ref_model, optimizer, groups, cfg, eos: int, pad: int) -> None:
    """The synchronous loop's learn half (``bench.reference_loop.learn``, as ``run_reference``
    calls it): ref forward, then one AdamW update per disjoint random mini-batch."""
    from bench.reference_loop import learn, token_logprobs

    batch = _loop_tensors(groups, cfg, eos, pad)
    if ref_model:
        temperature = cfg.rollout.temperature
        batch.ref_lp = token_logprobs(ref_model, batch.prompts, batch.completions, temperature)
    learn(model, optimizer, cfg, batch, batch.old_lp)


WARMUP = 2


def _batches(cfg, tokenizer, count: int, task: str) -> list[list]:
    """``count`` batches of demo-shaped groups for ``task``; batch k sampled one batch behind the
    learner (version k - 1 of the batches, each ``versions_per_batch`` policy versions), as the
    demo's actors run: kept by max_staleness, and never a version the learner has not announced
    when it reads the batch."""
    rng = random.Random(0)
    per_batch = cfg.learner.versions_per_batch
    return [
        _groups(
            tokenizer,
            cfg.learner.groups_per_step,
            cfg.rollout.group_size,
            max(0, k - 1) * per_batch,
            rng,
            cfg.algo.actors_score_reference,
            TASKS[task][0],
            cfg.rollout.max_new_tokens,
        )
        for k in range(count)
    ]


def _fill(cfg, batches) -> None:
    """Publish every group of ``batches`` to the run's stream, as actors would."""
    from streamrl.broker.client import connect_async
    from streamrl.broker.keys import Keys
    from streamrl.broker.stream import RolloutProducer

    async def fill():
        r = connect_async(cfg.broker, cfg.run.dir)
        producer = RolloutProducer(r, Keys.from_config(cfg.run, cfg.broker), cfg.broker)
        for batch in batches:
            for g in batch:
                await producer.publish(g)
        await r.aclose()

    asyncio.run(fill())


def _timed_learner(cfg):
    """The real learner, its methods wrapped so each call's time lands in a phase of ``PHASES``."""
    from streamrl.learner import step as learner_step
    from streamrl.learner.grpo import GRPO

    learner = GRPO(cfg)
    timer = _Timer()
    io = learner.io
    timer.wrap(io, "next_batch", "read+prepare")
    timer.wrap(io, "publish", "publish")
    timer.wrap(learner, "record_step", "record")
    # with ack_policy checkpoint the ack runs inside save_checkpoint
    timer.wrap(learner, "save_checkpoint", "checkpoint+ack")
    if cfg.learner.ack_policy == "step":
        timer.wrap(io, "ack", "checkpoint+ack")
    timer.wrap(learner_step, "_logprobs_no_grad", "reference forward")
    return learner, timer


def _learner_step(learner, timer) -> tuple[dict, dict]:
    """One ``train_next``: its step row, and its seconds in all and per phase."""
    before = dict(timer.seconds)
    t0 = time.perf_counter()
    row = learner.train_next()
    total = time.perf_counter() - t0
    spent = {p: timer.seconds.get(p, 0.0) - before.get(p, 0.0) for p in PHASES}
    # forward+backward and optimizer come from the learner's own per-update timers
    spent["forward+backward"], spent["optimizer"] = _last_update_split(learner)
    spent["other"] = total - sum(spent.values())
    return row, {"total": total, **spent}


def _summary(cfg, task: str, steps: int, learner_rows, reference_s, tokens) -> dict:
    medians = {p: statistics.median(r[p] for r in learner_rows) for p in learner_rows[0]}
    means = {p: statistics.fmean(r[p] for r in learner_rows) for p in learner_rows[0]}
    return {
        "learner": medians,
        "learner_mean": means,
        "sample": statistics.median(s for s, _ in reference_s),
        "reference": statistics.median(learn for _, learn in reference_s),
        "rollout": statistics.median(s + learn for s, learn in reference_s),
        "samples": cfg.learner.groups_per_step * cfg.rollout.group_size,
        "steps": steps,
        "task": task,
        # per step: prompt + completion tokens, the learner's packed tokens, its tokens/s, and
        # the reference's padded tokens (prompts + completions padded to the batch's longest)
        "sequence_tokens": statistics.median(t[0] for t in tokens),
        "packed_tokens": statistics.median(t[1] for t in tokens),
        "tokens_per_s": statistics.median(t[2] for t in tokens),
        "padded_tokens": statistics.median(t[3] for t in tokens),
    }


def measure(steps: int, overrides: list[str] = (), task: str = "demo") -> dict:
    """Median per-step seconds of the learner (with its phase split) and of the reference learn,
    and the tokens each ran on, for ``task`` (a key of ``TASKS``)."""
    from bench.reference_loop import sample
    from streamrl.broker.server import EmbeddedRedis
    from streamrl.configs import load_config
    from streamrl.examples.reverse_digits.assets import build_policy
    from streamrl.policy.load import load_policy, load_tokenizer

    torch.set_num_threads(1)
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    tmp = Path(tempfile.mkdtemp(prefix="bench-learner-cost-"))
    policy = build_policy(tmp / "policy", warm_start_steps=0)
    tokenizer = load_tokenizer(str(policy))
    with EmbeddedRedis(load_config(CONFIG).broker, tmp / "redis") as server:
        cfg = load_config(
            CONFIG,
            [
                f"run.name=cost-{uuid.uuid4().hex[:8]}", f"run.dir={tmp / 'run'}",
                f"model.path={policy}", f"broker.redis_url={server.url}", "run.max_time_s=0",
                f"run.max_steps={steps + WARMUP}", "learner.read_timeout_s=30",
                *TASKS[task][1], *overrides,
            ],
            env={},
        )  # fmt: skip
        batches = _batches(cfg, tokenizer, steps + WARMUP, task)
        _fill(cfg, batches)
        learner, timer = _timed_learner(cfg)
        reference = load_policy(str(policy))
        reference.train()
        ref_model = load_policy(str(policy)).requires_grad_(False) if cfg.algo.kl_coef > 0 else None
        eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
        lc = cfg.learner
        optimizer = torch.optim.AdamW(
            reference.parameters(), lr=lc.lr, betas=tuple(lc.betas), weight_decay=0.0
        )
        learner_rows, reference_s, tokens = [], [], []
        for k in range(steps + WARMUP):
            row, learner_s = _learner_step(learner, timer)
            view = _loop_tensors(batches[k], cfg, eos, pad)
            t1 = time.perf_counter()
            if task == "demo":
                reference.eval()
                sample(
                    reference,
                    view.prompts,
                    cfg.rollout.max_new_tokens,
                    eos=-1,
                    pad=0,
                    temperature=1.0,
                )
                reference.train()
            t2 = time.perf_counter()
            _reference_learn(reference, ref_model, optimizer, batches[k], cfg, eos, pad)
            t3 = time.perf_counter()
            if k >= WARMUP:
                learner_rows.append(learner_s)
                reference_s.append((t2 - t1, t3 - t2))
                padded = view.prompts.numel() + view.completions.numel()
                tokens.append(
                    (row["sequence_tokens"], row["packed_tokens"], row["tokens_per_s"], padded)
                )
        learner.close()
    return _summary(cfg, task, steps, learner_rows, reference_s, tokens)


def _last_update_split(learner) -> tuple[float, float]:
    from streamrl.learner import metrics as m

    fb = _histogram_sum(m.STEP_PHASE.labels("forward_backward"))
    opt = _histogram_sum(m.STEP_PHASE.labels("optimizer"))
    previous = getattr(learner, "_bench_split", (0.0, 0.0))
    learner._bench_split = (fb, opt)
    return fb - previous[0], opt - previous[1]


def _histogram_sum(child) -> float:
    return child._sum.get()


def phase_table(result: dict) -> list[str]:
    """The learner step's phases, and on the demo task the reference rollout beside it."""
    lm, mean, n = result["learner"], result["learner_mean"], result["samples"]
    rows = ["| phase | median ms per step | mean ms | share of median |", "|---|---|---|---|"]
    for phase in [*PHASES, "other"]:
        rows.append(
            f"| {phase} | {lm[phase] * 1000:.0f} | {mean[phase] * 1000:.0f} "
            f"| {lm[phase] / lm['total']:.0%} |"
        )
    rows.append(
        f"| **learner step** | **{lm['total'] * 1000:.0f}** | {mean['total'] * 1000:.0f} | |"
    )
    ref, rollout = result["reference"], result["rollout"]
    rows.append(f"| reference learn half (plain torch, 2 x 128) | {ref * 1000:.0f} | | |")
    if result["task"] != "demo":
        return rows
    return [
        *rows,
        f"| reference sampling (KV cache, 256 x 4 tokens) | {result['sample'] * 1000:.0f} | | |",
        f"| **reference rollout (sample + learn)** | **{rollout * 1000:.0f}** | | |",
        "",
        f"Samples/s: learner {n / lm['total']:,.0f}, reference loop {n / rollout:,.0f}; "
        f"learner / reference loop (sample + learn) = {rollout / lm['total']:.2f}x.",
    ]


def summary_table(results: list[dict]) -> list[str]:
    """Per task: the learner step against the reference learn half, and the tokens each paid for."""
    rows = [
        "| task | learner step | reference learn half | **learner step / reference learn half** "
        "| prompt + completion tokens per step | learner's packed tokens | reference's padded "
        "tokens | **learner tokens/s** | reference learn half tokens/s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        step, ref, real = r["learner"]["total"], r["reference"], r["sequence_tokens"]
        rows.append(
            f"| {r['task']} | {step * 1000:.0f} ms | {ref * 1000:.0f} ms | **{step / ref:.2f}x** "
            f"| {real:,.0f} | {r['packed_tokens']:,.0f} ({r['packed_tokens'] / real:.2f}x) "
            f"| {r['padded_tokens']:,.0f} ({r['padded_tokens'] / real:.2f}x) "
            f"| **{r['tokens_per_s']:,.0f}** | {real / ref:,.0f} |"
        )
    return rows


def run(quick: bool = False, steps: int | None = None) -> str:
    steps = steps or (3 if quick else 10)
    results = [measure(steps, task=task) for task in TASKS]
    today = datetime.date.today().isoformat()
    command = "python -m bench.learner_cost" + (f" --steps {steps}" if steps != 10 else "")
    lines = [
        "## Learner cost per step and tokens/s vs the reference loop's learn half",
        "",
        f"{today}, {os.cpu_count()} cores, {platform.machine()}, torch {torch.__version__}, 1 rank, "
        f"1 torch thread. Command: `{command}` (or `python -m bench --only learner_cost`). "
        f"{results[0]['samples']} samples per step (configs/demo_cpu.yaml), median of {steps} "
        "steps after 2 warm-up steps per task, the tasks back to back, learner and reference "
        "alternating step by step in one process. Goal: learner step <= 1.5x the reference "
        "learn half on the demo task. Long-tail: completion lengths 1-24 tokens, "
        f"P(k) ~ k^-{LONGTAIL_EXPONENT} (median 3).",
        "",
        *summary_table(results),
    ]
    for r in results:
        lines += ["", f"**{r['task']}**, phases of the learner step:", "", *phase_table(r)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10, help="measured steps per task")
    print(run(steps=parser.parse_args(argv).steps))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
