"""The real learner (Redis stream -> DeepSpeed ZeRO-2) on on-policy data equals synchronous GRPO."""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F
from learner_rollouts import sample_groups, xadd_groups

from configs import Config
from weightsync.policy import load_policy, load_tokenizer

STEPS = 4
GROUPS = 4
GROUP_SIZE = 8
LR, BETAS, CLIP, EPS, GRAD_CLIP = 3e-4, (0.9, 0.99), 0.2, 1e-4, 1.0


def learner_config(redis_cfg: Config, policy: str, **sections) -> Config:
    data = {
        "run": {"name": redis_cfg.run.name, "dir": redis_cfg.run.dir},
        "broker": {"redis_url": redis_cfg.broker.redis_url, "block_ms": 200},
        "model": {"path": policy},
        "learner": {
            "lr": LR,
            "betas": list(BETAS),
            "grad_clip": GRAD_CLIP,
            "groups_per_step": GROUPS,
            "read_timeout_s": 3.0,
            "checkpoint_every": 1000,
        },
        "algo": {"clip_low": CLIP, "clip_high": CLIP, "adv_eps": EPS},
        "weightsync": {"transport": "none"},
        "metrics": {"enabled": False},
    }
    for section, values in sections.items():
        data.setdefault(section, {}).update(values)
    return Config.model_validate(data)


def synchronous_grpo_step(model, optimizer, groups) -> bool:
    """Textbook on-policy GRPO: (r - mean)/(std + eps), ratio against the sampling log-probs, mean over
    every completion token of the batch (a group whose rewards are all equal has advantage 0: it adds
    tokens to the mean and nothing to the sum). A batch without any signal takes no step."""
    if all(
        min(c.reward for c in g.completions) == max(c.reward for c in g.completions) for g in groups
    ):
        return False
    terms, tokens = [], 0
    for group in groups:
        rewards = torch.tensor([c.reward for c in group.completions], dtype=torch.float64)
        advantages = (rewards - rewards.mean()) / (rewards.std(unbiased=False) + EPS)
        prompt = torch.from_numpy(group.prompt_token_ids.astype("int64"))
        for completion, advantage in zip(group.completions, advantages, strict=True):
            completion_ids = torch.from_numpy(completion.token_ids.astype("int64"))
            ids = torch.cat([prompt, completion_ids])[None]
            logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1]
            logprobs = F.log_softmax(logits, dim=-1).gather(-1, completion_ids[:, None]).squeeze(-1)
            ratio = torch.exp(logprobs - torch.from_numpy(completion.logprobs))
            a = float(advantage) if rewards.max() > rewards.min() else 0.0
            terms.append(-torch.minimum(ratio * a, ratio.clamp(1 - CLIP, 1 + CLIP) * a).sum())
            tokens += len(completion_ids)
    optimizer.zero_grad()
    (torch.stack(terms).sum() / tokens).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)
    optimizer.step()
    return True


@pytest.mark.timeout(120)
def test_max_staleness_zero_on_policy_learner_equals_synchronous_grpo(redis_cfg, demo_policy):
    from learner.loop import Learner

    tokenizer = load_tokenizer(demo_policy)
    sync_model = load_policy(demo_policy)
    optimizer = torch.optim.AdamW(sync_model.parameters(), lr=LR, betas=BETAS, weight_decay=0.0)
    rng = random.Random(1)
    version = uniform = 0
    for _ in range(STEPS):
        groups = sample_groups(sync_model, tokenizer, rng, GROUPS, GROUP_SIZE, version)
        uniform += sum(len({c.reward for c in g.completions}) == 1 for g in groups)
        xadd_groups(redis_cfg, groups)
        sync_model.train()
        version += synchronous_grpo_step(sync_model, optimizer, groups)
    assert version >= 2, "the sampled groups carried too little signal to compare anything"
    assert uniform, "no zero-variance group: the learner's skip path would go untested"

    # A small token budget forces gradient accumulation over several micro-batches.
    cfg = learner_config(
        redis_cfg,
        demo_policy,
        run={"max_steps": version},
        algo={"max_staleness": 0, "proximal": "recompute"},
        learner={"micro_batch_tokens": 48},
    )
    learner = Learner(cfg)
    progress = learner.run(echo=lambda line: None)
    assert progress.version == version

    learned = dict(learner.model.named_parameters())
    for name, expected in sync_model.named_parameters():
        diff = (learned[name] - expected).abs().max().item()
        assert diff < 1e-5, f"{name}: learner and synchronous GRPO differ by {diff:.2e}"
    moved = max(
        (p - q).abs().max().item()
        for p, q in zip(load_policy(demo_policy).parameters(), sync_model.parameters(), strict=True)
    )
    assert moved > 1e-3  # the comparison is not between two untouched models
