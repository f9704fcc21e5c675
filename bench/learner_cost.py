"""Learner cost per sample on the demo batch: the whole learner step against the reference loop's learn step.

The learner side is the real thing on one rank: ``Learner.train_next`` on the CPU demo config
(``configs/demo_cpu.yaml``: 16 groups x 16 completions per step, k3 KL to the initial policy, one
update per batch, shm weight publishing, metrics served) reading pre-filled groups from a real
Redis stream. Under the preset's ``algo.reference_on: actors`` the groups carry the reference
log-probs, as the actors send them, and the learner runs no reference forward. Each step is
split into phases by timing the learner's own methods: read + prepare (stream, decode,
advantages), reference forward, forward+backward, optimizer, publish (weights + version +
admission count), record (step row, metrics) and checkpoint/ack.

The reference is one rollout of the plain synchronous loop the demo recipe comes from (one
process: sample, score, learn; the recipe of the README's demo section): sampling 16 prompts x 16
completions of 4 tokens (3 digits + end of sequence, what a trained policy writes) with a KV cache
at temperature 1, then the learn half on the same 256 samples as the learner: a reference-model
forward when KL is on, then two clipped token-mean AdamW updates on disjoint halves of 128,
gradient clipping 1.0, plain torch, no Redis. Learner and reference run alternately in one
process, so load from other processes hits both alike: report ratios, not absolute times.
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
PHASES = [
    "read+prepare",
    "reference forward",
    "forward+backward",
    "optimizer",
    "publish",
    "record",
    "checkpoint+ack",
]


def _groups(tokenizer, n: int, group_size: int, version: int, rng: random.Random, with_ref: bool):
    """Demo-shaped groups: a reverse-3-digits prompt, 2-5 token completions, mixed rewards;
    ``with_ref``: with reference log-probs, as actors send them under ``algo.reference_on: actors``."""
    from streamrl.broker.wire import Completion, RolloutGroup
    from streamrl.examples.reverse_digits.task import make_example

    eos = tokenizer.eos_token_id
    digits = [tokenizer.convert_tokens_to_ids(d) for d in "0123456789"]
    out = []
    for g in range(n):
        prompt = tokenizer(make_example(rng)["prompt"])["input_ids"]
        completions = []
        for _ in range(group_size):
            length = rng.randint(1, 4)
            tokens = [rng.choice(digits) for _ in range(length)] + [eos]
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


def _reference_learn(model, ref_model, optimizer, batch, cfg) -> None:
    """The synchronous loop's learn half: ref forward, then one AdamW update per disjoint half."""
    from streamrl.learner import algorithm
    from streamrl.learner.batching import collate
    from streamrl.learner.engine import token_logprobs

    a = cfg.algo
    order = torch.randperm(len(batch)).tolist()
    for half in (order[: len(order) // 2], order[len(order) // 2 :]):
        mb = collate([batch[i] for i in half], 0)
        ref = None
        if ref_model is not None:
            with torch.no_grad():
                ref = token_logprobs(ref_model, mb, 1.0)
        logprobs, entropy = token_logprobs(model, mb, 1.0, with_entropy=True)
        loss, _ = algorithm.policy_loss(
            logprobs, mb.behaviour_logprobs, mb.advantages, mb.completion_mask,
            clip_low=a.clip_low, clip_high=a.clip_high, rho_max=a.rho_max,
            ref_logprobs=ref, kl_coef=a.kl_coef, normalizer=float(mb.num_tokens),
        )  # fmt: skip
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()


def measure(steps: int, overrides: list[str] = ()) -> dict:
    """Median per-step seconds of the learner (with its phase split) and of the reference learn."""
    from bench.reference_loop import sample
    from streamrl.broker.client import connect_async
    from streamrl.broker.keys import Keys
    from streamrl.broker.server import EmbeddedRedis
    from streamrl.broker.stream import RolloutProducer
    from streamrl.configs import load_config
    from streamrl.examples.reverse_digits.assets import build_policy
    from streamrl.learner import step as learner_step
    from streamrl.learner.batching import samples_from_group
    from streamrl.learner.loop import Learner
    from streamrl.weightsync.policy import load_policy, load_tokenizer

    torch.set_num_threads(1)
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    tmp = Path(tempfile.mkdtemp(prefix="bench-learner-cost-"))
    policy = build_policy(tmp / "policy", warm_start_steps=0)
    tokenizer = load_tokenizer(str(policy))
    warmup = 2
    with EmbeddedRedis(load_config(CONFIG).broker, tmp / "redis") as server:
        cfg = load_config(
            CONFIG,
            [
                f"run.name=cost-{uuid.uuid4().hex[:8]}", f"run.dir={tmp / 'run'}",
                f"model.path={policy}", f"broker.redis_url={server.url}", "run.max_time_s=0",
                f"run.max_steps={steps + warmup}", "learner.read_timeout_s=30", *overrides,
            ],
            env={},
        )  # fmt: skip
        rng = random.Random(0)
        per_step = cfg.learner.groups_per_step
        # batch k is sampled one batch behind the learner (version k - 1 of the batches, each
        # versions_per_batch policy versions), as the demo's actors run: kept by max_staleness, and
        # never a version the learner has not announced when it reads the batch
        per_batch = cfg.learner.versions_per_batch
        with_ref = cfg.algo.actors_score_reference
        batches = [
            _groups(
                tokenizer,
                per_step,
                cfg.rollout.group_size,
                max(0, k - 1) * per_batch,
                rng,
                with_ref,
            )
            for k in range(steps + warmup)
        ]

        async def fill():
            r = connect_async(cfg.broker, cfg.run.dir)
            producer = RolloutProducer(r, Keys.from_config(cfg), cfg.broker)
            for batch in batches:
                for g in batch:
                    await producer.publish(g)
            await r.aclose()

        asyncio.run(fill())

        learner = Learner(cfg)
        timer = _Timer()
        io = learner.io
        timer.wrap(io, "next_batch", "read+prepare")
        timer.wrap(io, "publish", "publish")
        timer.wrap(io, "record", "record")
        # with ack_policy checkpoint the ack runs inside save_checkpoint
        timer.wrap(learner, "save_checkpoint", "checkpoint+ack")
        if cfg.learner.ack_policy == "step":
            timer.wrap(io, "ack", "checkpoint+ack")
        timer.wrap(learner_step, "_logprobs_no_grad", "reference forward")

        reference = load_policy(str(policy))
        reference.train()
        ref_model = load_policy(str(policy)) if cfg.algo.kl_coef > 0 else None
        lc = cfg.learner
        optimizer = torch.optim.AdamW(
            reference.parameters(), lr=lc.lr, betas=tuple(lc.betas), weight_decay=0.0
        )
        learner_rows, reference_s = [], []
        for k in range(steps + warmup):
            before = dict(timer.seconds)
            t0 = time.perf_counter()
            learner.train_next()
            total = time.perf_counter() - t0
            spent = {p: timer.seconds.get(p, 0.0) - before.get(p, 0.0) for p in PHASES}
            # forward+backward and optimizer come from the learner's own per-update timers
            spent["forward+backward"], spent["optimizer"] = _last_update_split(learner)
            spent["other"] = total - sum(spent.values())
            samples = [
                s for g in batches[k] for s in samples_from_group(g, [0.5] * len(g.completions))
            ]
            prompts = torch.tensor(
                [g.prompt_token_ids.tolist() for g in batches[k] for _ in g.completions]
            )
            t1 = time.perf_counter()
            reference.eval()
            sample(reference, prompts, 4, eos=-1, pad=0, temperature=1.0)
            reference.train()
            t2 = time.perf_counter()
            _reference_learn(reference, ref_model, optimizer, samples, cfg)
            t3 = time.perf_counter()
            if k >= warmup:
                learner_rows.append({"total": total, **spent})
                reference_s.append((t2 - t1, t3 - t2))
        learner.close()
    samples_per_step = per_step * cfg.rollout.group_size
    medians = {p: statistics.median(r[p] for r in learner_rows) for p in learner_rows[0]}
    means = {p: statistics.fmean(r[p] for r in learner_rows) for p in learner_rows[0]}
    return {
        "learner": medians,
        "learner_mean": means,
        "sample": statistics.median(s for s, _ in reference_s),
        "reference": statistics.median(learn for _, learn in reference_s),
        "rollout": statistics.median(s + learn for s, learn in reference_s),
        "samples": samples_per_step,
        "steps": steps,
    }


def _last_update_split(learner) -> tuple[float, float]:
    from streamrl.learner import metrics as m

    fb = _histogram_sum(m.STEP_PHASE.labels("forward_backward"))
    opt = _histogram_sum(m.STEP_PHASE.labels("optimizer"))
    previous = getattr(learner, "_bench_split", (0.0, 0.0))
    learner._bench_split = (fb, opt)
    return fb - previous[0], opt - previous[1]


def _histogram_sum(child) -> float:
    return child._sum.get()


def table(result: dict) -> list[str]:
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
    rows += [
        f"| reference learn half (plain torch, 2 x 128) | {ref * 1000:.0f} | | |",
        f"| reference sampling (KV cache, 256 x 4 tokens) | {result['sample'] * 1000:.0f} | | |",
        f"| **reference rollout (sample + learn)** | **{rollout * 1000:.0f}** | | |",
        "",
        f"Samples/s: learner {n / lm['total']:,.0f}, reference loop {n / rollout:,.0f} "
        f"(its learn half alone {n / ref:,.0f}). **Learner / reference loop = "
        f"{rollout / lm['total']:.2f}x** (goal >= 1.3x); learner / reference learn half = "
        f"{ref / lm['total']:.2f}x.",
    ]
    return rows


def run(quick: bool = False) -> str:
    steps = 5 if quick else 20
    result = measure(steps)
    today = datetime.date.today().isoformat()
    return "\n".join(
        [
            "## Learner cost per sample (demo batch) vs the reference loop's learn step",
            "",
            f"{today}, {os.cpu_count()} cores, {platform.machine()}, torch {torch.__version__}, 1 rank, "
            f"1 torch thread. Command: `python -m bench --only learner_cost{' --quick' if quick else ''}`. "
            f"{result['samples']} samples per step (configs/demo_cpu.yaml), median of {result['steps']} "
            "steps after 2 warm-up steps, learner and reference alternating in one process.",
            "",
            *table(result),
        ]
    )


if __name__ == "__main__":
    print(run())
