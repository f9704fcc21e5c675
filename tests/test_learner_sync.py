"""The real learner (Redis stream -> DeepSpeed ZeRO-2) on on-policy data equals synchronous GRPO."""

from __future__ import annotations

import math
import random

import pytest
import torch
import torch.nn.functional as F
from learner_rollouts import DEMO_REWARD, sample_groups, xadd_groups

from streamrl.configs import Config
from streamrl.policy.load import load_policy, load_tokenizer

STEPS = 4
GROUPS = 4
GROUP_SIZE = 8
LR, BETAS, CLIP, EPS, GRAD_CLIP = 3e-4, (0.9, 0.99), 0.2, 1e-4, 1.0
# The learner sums in another order than a per-sample loop (packed rows, other matmul shapes);
# AdamW divides by sqrt(v), so a coordinate whose gradient is float32 rounding noise can move by
# up to LR per step either way. A tenth of LR bounds that over these few steps; a wrong loss
# moves whole tensors by ~LR. (tests/test_learner_packing.py checks the packed gradient in float64.)
ADAM_ROUNDING = LR / 10


def learner_config(redis_cfg: Config, policy: str, **sections) -> Config:
    data = {
        "run": {"name": redis_cfg.run.name, "dir": redis_cfg.run.dir},
        "broker": {"redis_url": redis_cfg.broker.redis_url, "block_ms": 200},
        "model": {"path": policy},
        "rollout": {"group_size": GROUP_SIZE, "max_new_tokens": 8},
        "learner": {
            "lr": LR,
            # the references these runs are held against step AdamW at a constant LR
            "lr_scheduler": "constant",
            "betas": list(BETAS),
            "grad_clip": GRAD_CLIP,
            "groups_per_step": GROUPS,
            "read_timeout_s": 3.0,
            "checkpoint_every": 1000,
        },
        "reward": {"functions": [DEMO_REWARD]},
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
    from streamrl.learner.grpo import GRPO

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
    learner = GRPO(cfg)
    progress = learner.run(echo=lambda line: None)
    assert progress.version == version

    learned = dict(learner.model.named_parameters())
    for name, expected in sync_model.named_parameters():
        diff = (learned[name] - expected).abs().max().item()
        assert diff < ADAM_ROUNDING, f"{name}: learner and synchronous GRPO differ by {diff:.2e}"
    moved = max(
        (p - q).abs().max().item()
        for p, q in zip(load_policy(demo_policy).parameters(), sync_model.parameters(), strict=True)
    )
    # the comparison is not between two untouched models
    assert moved > 1e-3


def test_token_entropy_is_that_of_the_tempered_distribution_and_the_bonus_raises_it(demo_policy):
    import numpy as np

    from streamrl.learner.batching import Sample, collate
    from streamrl.learner.engine import token_logprobs

    model = load_policy(demo_policy)
    rng = np.random.default_rng(0)
    samples = [
        Sample(rng.integers(4, 60, size=n), 2, np.zeros(n - 2, np.float32), np.zeros(n - 2, np.int64), 1.0, 0.0, "g")
        for n in (5, 8)
    ]  # fmt: skip
    batch = collate(samples, pad_id=0)
    logprobs, entropy = token_logprobs(model, batch, 0.7, with_entropy=True)
    assert torch.equal(logprobs, token_logprobs(model, batch, 0.7))
    with torch.no_grad():
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
        logits = logits[:, :-1].double() / 0.7
    for i, t in batch.completion_mask.nonzero().tolist():
        probs = [math.exp(v) for v in logits[i, t].tolist()]
        z = sum(probs)
        expected = -sum(p / z * math.log(p / z) for p in probs if p > 0)
        assert entropy[i, t].item() == pytest.approx(expected, rel=1e-4)

    # only the bonus (zero advantages): one SGD step on it raises the entropy where it counts
    from streamrl.learner import algorithm

    mask = batch.completion_mask
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    loss, stats = algorithm.policy_loss(
        logprobs, logprobs.detach(), torch.zeros(2), mask, clip_low=0.2, clip_high=0.2,
        rho_max=2.0, entropy=entropy, entropy_coef=1.0,
    )  # fmt: skip
    assert stats.entropy == pytest.approx(float(entropy.detach()[mask].mean()))
    loss.backward()
    optimizer.step()
    _, after = token_logprobs(model, batch, 0.7, with_entropy=True)
    assert float(after.detach()[mask].mean()) > float(entropy.detach()[mask].mean())


def test_the_learners_device_and_backend_follow_deepspeeds_accelerator(monkeypatch):
    """A GPU host's learner runs on CUDA with DeepSpeed's cuda accelerator (no forced ``cpu`` left
    over from the CPU demo), and ``DS_ACCELERATOR=cpu`` keeps it on the CPU, model and engine alike."""
    import torch

    from streamrl.learner import engine

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.delenv("DS_ACCELERATOR", raising=False)
    assert engine.accelerator() == "cuda"
    assert engine.device() == torch.device("cuda", 0)
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    assert engine.accelerator() == "cpu" and engine.device() == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.delenv("DS_ACCELERATOR")
    assert engine.accelerator() == "cpu" and engine.device() == torch.device("cpu")
