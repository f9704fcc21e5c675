"""PPO-style mini-batches: one pass over a batch is ``learner.minibatches`` optimizer steps on disjoint parts."""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F
from learner_rollouts import sample_groups, xadd_groups
from test_learner_sync import ADAM_ROUNDING, BETAS, CLIP, EPS, GRAD_CLIP, LR, learner_config

from streamrl.learner.step import minibatch_indices, minibatch_seed
from streamrl.policy.load import load_policy, load_tokenizer

GROUPS, GROUP_SIZE, MINIBATCHES = 4, 8, 2


def test_minibatch_indices_are_disjoint_cover_the_batch_and_agree_for_one_seed():
    parts = minibatch_indices(17, 3, seed=5)
    assert sorted(i for p in parts for i in p) == list(range(17))
    assert sorted(len(p) for p in parts) == [5, 6, 6]
    assert parts == minibatch_indices(17, 3, seed=5)
    assert parts != minibatch_indices(17, 3, seed=6)
    # more mini-batches than samples: the extra ones are empty, nothing is duplicated
    assert sorted(len(p) for p in minibatch_indices(2, 4, seed=0)) == [0, 0, 1, 1]


def reference_minibatch_steps(model, optimizer, groups, seed: int) -> int:
    """The reference loop's update (docs/measured.md, the demo task): advantages over the whole rollout, then one AdamW step
    per disjoint mini-batch, each the token mean of its own completions, ratio against the sampling
    log-probs. Returns the optimizer steps taken."""
    rows = []
    for group in groups:
        rewards = torch.tensor([c.reward for c in group.completions], dtype=torch.float64)
        advantages = (rewards - rewards.mean()) / (rewards.std(unbiased=False) + EPS)
        prompt = torch.from_numpy(group.prompt_token_ids.astype("int64"))
        rows += [(prompt, c, float(a)) for c, a in zip(group.completions, advantages, strict=True)]
    steps = 0
    for part in minibatch_indices(len(rows), MINIBATCHES, seed):
        terms, tokens = [], 0
        for prompt, completion, advantage in (rows[i] for i in part):
            completion_ids = torch.from_numpy(completion.token_ids.astype("int64"))
            ids = torch.cat([prompt, completion_ids])[None]
            logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1]
            logprobs = F.log_softmax(logits, dim=-1).gather(-1, completion_ids[:, None]).squeeze(-1)
            ratio = torch.exp(logprobs - torch.from_numpy(completion.logprobs))
            clipped = ratio.clamp(1 - CLIP, 1 + CLIP)
            terms.append(-torch.minimum(ratio * advantage, clipped * advantage).sum())
            tokens += len(completion_ids)
        optimizer.zero_grad()
        (torch.stack(terms).sum() / tokens).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)
        optimizer.step()
        steps += 1
    return steps


@pytest.mark.timeout(120)
def test_two_minibatches_equal_two_reference_updates_on_disjoint_halves(redis_cfg, demo_policy):
    from streamrl.learner.grpo import GRPO

    tokenizer = load_tokenizer(demo_policy)
    ref_model = load_policy(demo_policy)
    optimizer = torch.optim.AdamW(ref_model.parameters(), lr=LR, betas=BETAS, weight_decay=0.0)
    rng = random.Random(3)
    version = 0
    batches = 2
    for _ in range(batches):
        groups = sample_groups(ref_model, tokenizer, rng, GROUPS, GROUP_SIZE, version)
        xadd_groups(redis_cfg, groups)
        ref_model.train()
        version += reference_minibatch_steps(
            ref_model, optimizer, groups, minibatch_seed(redis_cfg.run.seed, version)
        )
    assert version == batches * MINIBATCHES

    cfg = learner_config(
        redis_cfg,
        demo_policy,
        run={"max_steps": batches},
        # zero-variance groups stay in the batch, as in the reference loop (advantage 0, tokens counted)
        algo={"max_staleness": 0, "proximal": "recompute", "skip_zero_variance": False},
        learner={"micro_batch_tokens": 48, "minibatches": MINIBATCHES},
    )
    learner = GRPO(cfg)
    rows = []
    progress = learner.run(echo=rows.append)
    assert progress.version == version, rows
    assert progress.step == batches

    learned = dict(learner.model.named_parameters())
    for name, expected in ref_model.named_parameters():
        diff = (learned[name] - expected).abs().max().item()
        assert diff < ADAM_ROUNDING, (
            f"{name}: learner and the two-mini-batch reference differ by {diff:.2e}"
        )
    moved = max(
        (p - q).abs().max().item()
        for p, q in zip(load_policy(demo_policy).parameters(), ref_model.parameters(), strict=True)
    )
    assert moved > 1e-3
