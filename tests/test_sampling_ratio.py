"""Truncated sampling (top-k, top-p) against the learner's ratio and gradient (docs/guarantees.md,
"What mu is"), and the chunked log-prob pass against the unchunked one. All in float64."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from streamrl.actors.engines.base import Request, SamplingParams
from streamrl.actors.engines.hf.engine import HFEngine
from streamrl.actors.engines.hf.sampling import processed_logprobs
from streamrl.configs.schema import LearnerConfig, RolloutConfig
from streamrl.learner.algorithm import policy_loss
from streamrl.learner.batching import Sample, collate
from streamrl.learner.engine import token_logprobs
from streamrl.learner.step import token_scorer
from streamrl.policy.load import load_policy, load_tokenizer
from streamrl.policy.logprobs import Sampling, sequence_logprobs

TRUNCATED = {"temperature": 0.8, "top_k": 5, "top_p": 0.9}
PROMPTS = ["314>", "12>", "98765>", "4444>"]


@pytest.fixture(scope="module")
def model64(demo_policy):
    return load_policy(demo_policy, torch.float64)


def _rollouts(model64, tokenizer) -> list[Sample]:
    """Completions the hf engine samples under top-k and top-p, with its behaviour log-probs."""
    params = SamplingParams(
        max_new_tokens=10, stop_token_ids=(tokenizer.eos_token_id,), **TRUNCATED
    )
    requests = [Request(str(i), tokenizer(p)["input_ids"]) for i, p in enumerate(PROMPTS * 2)]
    outputs = HFEngine(model64, tokenizer, batch_slots=4, seed=3).generate(requests, params)
    return [
        Sample(
            input_ids=np.asarray(r.prompt_token_ids + o.token_ids.tolist(), dtype=np.int64),
            prompt_len=len(r.prompt_token_ids),
            behaviour_logprobs=o.logprobs,
            versions=np.zeros(len(o.token_ids), dtype=np.int64),
            advantage=1.0,
            reward=0.0,
            group_id="0",
        )
        for r, o in zip(requests, outputs, strict=True)
    ]


def test_the_ratio_the_clip_acts_on_starts_at_one_under_top_p_and_top_k(model64, demo_policy):
    tokenizer = load_tokenizer(demo_policy)
    mb = collate(_rollouts(model64, tokenizer), tokenizer.pad_token_id or 0)
    score = token_scorer(RolloutConfig(**TRUNCATED), LearnerConfig())
    mask = mb.completion_mask
    with torch.no_grad():
        theta = score(model64, mb)
        full_softmax = token_logprobs(model64, mb, TRUNCATED["temperature"])
    mu = mb.behaviour_logprobs.double()
    # mu travels as float32: it is off by at most half an ulp of itself; the float64 passes
    # (KV-cached decode against one packed forward) by far less
    tolerance = float(np.finfo(np.float32).eps) * float(mu[mask].abs().max()) + 1e-12
    assert (theta - mu)[mask].abs().max() <= tolerance
    # the clip itself, at a range that tight, clips nothing
    _, stats = policy_loss(
        theta, mu, mb.advantages.double(), mask,
        clip_low=tolerance * 2, clip_high=tolerance * 2, rho_max=2.0,
    )  # fmt: skip
    assert stats.clip_fraction == 0.0
    # the truncation mattered: the full softmax puts every ratio below 1, some far below
    assert ((full_softmax - mu)[mask] <= tolerance).all()
    assert (full_softmax - mu)[mask].min() < -0.01


def test_the_ppo_gradient_is_the_gradient_of_the_truncated_policys_expected_advantage(model64):
    """At one prompt, over every token y of the vocabulary: the PPO loss with each y weighted by
    mu(y) is the expectation the sampler estimates, and its gradient must be
    -grad sum_y mu_theta(y) A(y), with mu_theta the sampler's own truncated distribution."""
    prompt = [5, 9, 7, 3]
    vocab = model64.get_output_embeddings().weight.shape[0]
    rows = torch.tensor([[*prompt, y] for y in range(vocab)])
    advantages = torch.linspace(-1.0, 2.0, vocab, dtype=torch.float64)
    s = Sampling(**TRUNCATED)

    model64.zero_grad()
    logits = model64(input_ids=rows[:1, :-1]).logits[0, -1]
    mu_theta = processed_logprobs(logits, s.temperature, s.top_k, s.top_p).exp()
    objective = (mu_theta * advantages).sum()
    objective.backward()
    expected = [p.grad.clone() for p in model64.parameters()]
    mu = mu_theta.detach()
    sampled = mu > 0
    assert 1 < int(sampled.sum()) < vocab

    def ppo_gradient(scored_under: Sampling) -> list[torch.Tensor]:
        model64.zero_grad()
        theta = sequence_logprobs(model64, rows, None, scored_under)[:, -1:]
        loss, _ = policy_loss(
            theta, mu.log()[:, None], (advantages * mu)[:, None], sampled[:, None],
            clip_low=0.2, clip_high=0.2, rho_max=2.0, normalizer=1.0,
        )  # fmt: skip
        loss.backward()
        grads = [-p.grad.clone() for p in model64.parameters()]
        model64.zero_grad()
        return grads

    # transformers' RMSNorm computes in float32 even in a float64 model, and the two sides sum
    # its backward over different rows: allow float32 rounding, of each parameter's largest entry
    eps = float(np.finfo(np.float32).eps)
    tolerances = [64 * eps * float(want.abs().max()) for want in expected]
    for got, want, tol in zip(ppo_gradient(s), expected, tolerances, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=tol)
    # scoring the full softmax instead (the old learner) is a different gradient
    full = ppo_gradient(Sampling(s.temperature))
    assert any(
        (got - want).abs().max() > 100 * tol
        for got, want, tol in zip(full, expected, tolerances, strict=True)
    )


@pytest.mark.parametrize(
    "sampling", [Sampling(0.7), Sampling(**TRUNCATED)], ids=["full", "top_k_top_p"]
)
def test_chunked_log_probs_entropy_and_gradients_equal_the_unchunked_ones(model64, sampling):
    rng = np.random.default_rng(4)
    ids = torch.as_tensor(rng.integers(4, 30, size=(3, 17)))
    outs = []
    for chunk in (ids.numel(), 5):
        model64.zero_grad()
        logprobs, entropy = sequence_logprobs(
            model64, ids, None, sampling, with_entropy=True, chunk_tokens=chunk
        )
        (logprobs.sum() + entropy.sum()).backward()
        outs.append((logprobs, entropy, [p.grad.clone() for p in model64.parameters()]))
    model64.zero_grad()
    (whole_lp, whole_h, whole_g), (lp, h, g) = outs
    torch.testing.assert_close(lp, whole_lp, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(h, whole_h, rtol=1e-12, atol=1e-12)
    for a, b in zip(g, whole_g, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_the_chunked_pass_keeps_no_vocabulary_wide_tensor_for_the_backward():
    """A Qwen-sized vocabulary on a tiny model: autograd keeps the hidden states, not the
    [tokens, vocabulary] logits, whatever the chunk."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    vocab, tokens = 151_936, 12
    config = Qwen2Config(
        vocab_size=vocab, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True,
    )  # fmt: skip
    model = Qwen2ForCausalLM(config)
    ids = torch.randint(0, vocab, (1, tokens + 1))
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    largest = []

    def pack(t):
        if t.untyped_storage().data_ptr() not in params:
            largest.append(t.untyped_storage().nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        logprobs, _ = sequence_logprobs(
            model, ids, None, Sampling(**TRUNCATED), with_entropy=True, chunk_tokens=5
        )
    # one float32 row of logits is vocab x 4 bytes; nothing saved is that wide
    assert max(largest) < vocab * 4
    logprobs.sum().backward()
    assert model.get_output_embeddings().weight.grad.abs().sum() > 0
