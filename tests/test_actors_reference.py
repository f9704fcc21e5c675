"""``algo.reference_on: actors``: the actor's reference pass gives the log-probs the learner's own
pass gives, and a learner that trains on them takes the same steps as one that runs the pass."""

from __future__ import annotations

import random
import uuid
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from learner_rollouts import sample_groups, xadd_groups
from rounding import assert_within_rounding
from test_learner_sync import learner_config

from streamrl.actors.reference import ReferenceScorer
from streamrl.policy.load import load_policy, load_tokenizer

TEMPERATURE = 0.7


def _scorer(policy: str, token_budget: int, temperature: float = TEMPERATURE) -> ReferenceScorer:
    return ReferenceScorer(policy, "auto", "cpu", temperature, token_budget)


@torch.no_grad()
def _one_by_one(model, prompt: list[int], completion: list[int]) -> torch.Tensor:
    """The obvious way: one unpadded forward pass per sequence."""
    ids = torch.tensor([prompt + completion])
    logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1] / TEMPERATURE
    return F.log_softmax(logits, dim=-1).gather(-1, torch.tensor(completion)[:, None]).squeeze(-1)


# 24 tokens: several forward passes of a few padded rows each; 4096: one pass for all
@pytest.mark.parametrize("token_budget", [24, 4096])
def test_the_actors_reference_logprobs_equal_one_forward_pass_per_sequence(
    demo_policy, token_budget
):
    scorer = _scorer(demo_policy, token_budget)
    model, exact = load_policy(demo_policy), load_policy(demo_policy, torch.float64)
    rng = random.Random(3)
    vocab = model.config.vocab_size
    prompts = [[rng.randrange(4, vocab) for _ in range(rng.randint(2, 6))] for _ in range(9)]
    completions = [[rng.randrange(4, vocab) for _ in range(rng.randint(1, 8))] for _ in range(9)]
    got = scorer.logprobs(prompts, completions)
    assert [len(g) for g in got] == [len(c) for c in completions]
    for prompt, completion, scores in zip(prompts, completions, got, strict=True):
        assert_within_rounding(
            scores,
            _one_by_one(model, prompt, completion).numpy(),
            _one_by_one(exact, prompt, completion).numpy(),
        )


@pytest.mark.timeout(240)
def test_a_learner_on_the_actors_reference_logprobs_trains_as_with_its_own_reference_pass(
    redis_cfg, demo_policy
):
    from streamrl.learner.grpo import GRPO

    steps, groups_per_step, group_size = 3, 4, 8
    model = load_policy(demo_policy)
    tokenizer = load_tokenizer(demo_policy)
    scorer = _scorer(demo_policy, 4096, temperature=1.0)
    rng = random.Random(5)
    # all sampled from the initial policy: the policy moves away from it after the first step,
    # so the KL term has a gradient in the later ones
    groups = sample_groups(model, tokenizer, rng, steps * groups_per_step, group_size, 0)
    for group in groups:
        refs = scorer.logprobs(
            [group.prompt_token_ids.tolist()] * len(group.completions),
            [c.token_ids.tolist() for c in group.completions],
        )
        for completion, ref in zip(group.completions, refs, strict=True):
            completion.ref_logprobs = ref

    trained = {}
    for reference_on in ("learner", "actors"):
        run = redis_cfg.model_copy(deep=True)
        run.run.name = f"{redis_cfg.run.name}-{reference_on}-{uuid.uuid4().hex[:6]}"
        # its own checkpoints: the second learner must not resume from the first's
        run.run.dir = str(Path(redis_cfg.run.dir) / reference_on)
        xadd_groups(run, groups)
        cfg = learner_config(
            run,
            demo_policy,
            run={"max_steps": steps},
            rollout={"temperature": 1.0},
            learner={"groups_per_step": groups_per_step},
            algo={"kl_coef": 1.0, "reference_on": reference_on, "max_staleness": 1000},
        )
        learner = GRPO(cfg)
        assert (learner.ref_model is None) == (reference_on == "actors")
        learner.run(echo=lambda line: None)
        trained[reference_on] = {n: p.detach().clone() for n, p in learner.model.named_parameters()}

    for name, expected in trained["learner"].items():
        diff = (trained["actors"][name] - expected).abs().max().item()
        assert diff < 1e-5, f"{name}: the two learners differ by {diff:.2e}"
