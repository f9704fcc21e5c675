"""The hf engine: behaviour log-probs, per-token versions across a weight swap, continuous refill, stops."""

from __future__ import annotations

import copy
import time

import numpy as np
import pytest
import torch
from rounding import assert_within_rounding

from streamrl.actors.engines.base import Request, SamplingParams
from streamrl.actors.engines.hf.engine import HFEngine
from streamrl.actors.engines.hf.sampling import processed_logprobs
from streamrl.policy.load import load_policy, load_tokenizer

PROMPTS = ["314>", "12>", "98765>", "1>", "4444>", "abcdefgh>", "70>"]


@pytest.fixture(scope="module")
def policy(demo_policy):
    return load_policy(demo_policy), load_tokenizer(demo_policy)


@pytest.fixture(scope="module")
def exact(demo_policy):
    """The policy in float64: what the engine's float32 log-probs approximate."""
    return load_policy(demo_policy, torch.float64)


def _requests(tokenizer, n: int) -> list[Request]:
    return [Request(str(i), tokenizer(PROMPTS[i % len(PROMPTS)])["input_ids"]) for i in range(n)]


def _recomputed_logprobs(model, request: Request, output, params: SamplingParams) -> np.ndarray:
    """The sampled tokens' log-probs from one plain forward pass over prompt + completion."""
    ids = torch.tensor([request.prompt_token_ids + output.token_ids.tolist()])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0]
    start = len(request.prompt_token_ids) - 1
    logprobs = processed_logprobs(logits[start:-1], params.temperature, params.top_k, params.top_p)
    tokens = torch.as_tensor(output.token_ids, dtype=torch.long)[:, None]
    return logprobs.gather(-1, tokens).squeeze(-1).numpy()


def _assert_behaviour_logprobs(policy, exact, request: Request, output, params) -> None:
    """The engine's log-probs are a plain forward pass's (float64), within float32 rounding, and
    no sampled token was outside the top-k/top-p set."""
    float32 = _recomputed_logprobs(policy, request, output, params)
    float64 = _recomputed_logprobs(exact, request, output, params)
    assert np.isfinite(float64).all()
    assert_within_rounding(output.logprobs, float32, float64)


@pytest.mark.parametrize(
    "sampling",
    [
        {},
        {"top_k": 5},
        {"top_p": 0.8, "temperature": 0.7},
        {"top_k": 10, "top_p": 0.9, "temperature": 1.3},
    ],
    ids=["plain", "top_k", "top_p", "top_k_top_p_temperature"],
)
def test_behaviour_logprobs_match_a_plain_forward_pass(policy, exact, sampling):
    model, tokenizer = policy
    params = SamplingParams(max_new_tokens=12, stop_token_ids=(tokenizer.eos_token_id,), **sampling)
    requests = _requests(tokenizer, 9)
    outputs = HFEngine(model, tokenizer, batch_slots=4, seed=1).generate(requests, params)
    assert [o.request_id for o in outputs] == [r.request_id for r in requests]
    for request, output in zip(requests, outputs, strict=True):
        assert len(output.token_ids) >= 1
        _assert_behaviour_logprobs(model, exact, request, output, params)


def test_more_requests_than_slots_are_all_completed_by_refilling_slots(policy, exact):
    model, tokenizer = policy
    batch_sizes = []
    hook = model.register_forward_pre_hook(
        lambda _m, _args, kwargs: batch_sizes.append(kwargs["input_ids"].shape[0]), with_kwargs=True
    )
    try:
        params = SamplingParams(max_new_tokens=10, stop_token_ids=(tokenizer.eos_token_id,))
        requests = _requests(tokenizer, 17)
        outputs = HFEngine(model, tokenizer, batch_slots=3, seed=2).generate(requests, params)
    finally:
        hook.remove()
    assert max(batch_sizes) <= 3
    assert len(outputs) == 17
    for request, output in zip(requests, outputs, strict=True):
        assert output.finish_reason in ("stop", "length")
        if output.finish_reason == "stop":
            assert output.token_ids[-1] == tokenizer.eos_token_id
        else:
            assert len(output.token_ids) == 10
        _assert_behaviour_logprobs(model, exact, request, output, params)


def test_refill_keeps_the_batch_full_across_calls_worth_and_reports_each_request_as_it_ends(
    policy, exact
):
    model, tokenizer = policy
    batch_sizes = []
    hook = model.register_forward_pre_hook(
        lambda _m, _args, kwargs: batch_sizes.append(kwargs["input_ids"].shape[0]), with_kwargs=True
    )
    params = SamplingParams(max_new_tokens=10, stop_token_ids=(tokenizer.eos_token_id,))
    first = _requests(tokenizer, 4)
    # two more waves of requests, then nothing: the engine must ask again only while a slot is free
    waves = [_requests(tokenizer, 7)[4:], _requests(tokenizer, 9)[7:]]
    refills, finished = [], {}

    def refill(room: int):
        # asked for no more than the free slots beyond what already waits
        assert 0 < room <= 4
        refills.append(len(finished))
        return waves.pop(0) if waves else []

    def on_finished(index, output):
        assert index not in finished
        finished[index] = output

    try:
        outputs = HFEngine(model, tokenizer, batch_slots=4, seed=3).generate(
            first, params, refill=refill, on_finished=on_finished
        )
    finally:
        hook.remove()
    requests = first + _requests(tokenizer, 9)[4:]
    assert [o.request_id for o in outputs] == [r.request_id for r in requests]
    assert max(batch_sizes) <= 4
    # every request was reported once, with the output generate returned
    assert sorted(finished) == list(range(9))
    for index, output in finished.items():
        assert output.request_id == outputs[index].request_id
        assert output.token_ids.tolist() == outputs[index].token_ids.tolist()
    # the first refill came once a slot was free, before all of the first requests ended
    assert refills[0] < 4
    for request, output in zip(requests, outputs, strict=True):
        assert output.finish_reason in ("stop", "length")
        _assert_behaviour_logprobs(model, exact, request, output, params)


class _SwapAfter:
    """Stages version 1 (perturbed weights) on the ``swap_at``-th poll, as a subscriber would."""

    live_source = ""

    def __init__(self, model, swap_at: int) -> None:
        self.swap_at = swap_at
        self.polls = 0
        self.applied_versions = []
        generator = torch.Generator().manual_seed(0)
        self.tensors = {
            name: p.detach() + 0.05 * torch.randn(p.shape, generator=generator)
            for name, p in model.named_parameters()
        }

    def take_staged(self):
        self.polls += 1
        return (1, self.tensors) if self.polls == self.swap_at else None

    def applied(self, version: int, recycled: dict | None = None) -> None:
        self.applied_versions.append(version)


def test_weight_swap_mid_generation_changes_token_versions_exactly_at_the_swap(demo_policy):
    model, tokenizer = load_policy(demo_policy), load_tokenizer(demo_policy)
    source = _SwapAfter(model, swap_at=5)
    engine = HFEngine(model, tokenizer, batch_slots=8, weight_source=source, seed=3)
    # no stop token: every completion runs all 12 steps
    params = SamplingParams(max_new_tokens=12)
    outputs = engine.generate(_requests(tokenizer, 6), params)
    # poll 1 precedes the prefill (token 0) and the first decode (token 1); poll k precedes the
    # decode of token k, so tokens 0..4 come from version 0 and tokens 5..11 from version 1
    for output in outputs:
        assert output.versions.tolist() == [0] * 5 + [1] * 7
    assert engine.version == 1 and source.applied_versions == [1]
    for name, param in model.named_parameters():
        torch.testing.assert_close(param.detach(), source.tensors[name])


def test_stop_strings_end_a_completion_right_after_the_string(policy):
    model, tokenizer = policy
    stops = tuple("0123456789")
    params = SamplingParams(max_new_tokens=16, stop=stops)
    outputs = HFEngine(model, tokenizer, batch_slots=8, seed=4).generate(
        _requests(tokenizer, 8), params
    )
    stopped = [o for o in outputs if o.finish_reason == "stop"]
    assert stopped, "the warmed demo policy writes digits; some completion must hit a digit"
    for output in outputs:
        text = tokenizer.decode(output.token_ids.tolist())
        if output.finish_reason == "stop":
            assert text[-1] in stops and not any(s in text[:-1] for s in stops)
        else:
            assert not any(s in text for s in stops) and len(output.token_ids) == 16


def test_abort_ends_unfinished_requests_with_finish_reason_abort(policy):
    model, tokenizer = policy
    calls = []

    def abort_after_three_steps() -> bool:
        calls.append(1)
        return len(calls) > 3

    params = SamplingParams(max_new_tokens=30)
    outputs = HFEngine(model, tokenizer, batch_slots=2, seed=5).generate(
        _requests(tokenizer, 5), params, abort_after_three_steps
    )
    assert [o.finish_reason for o in outputs] == ["abort"] * 5
    # three iterations ran: the first samples two tokens (prefill + decode), the others one each
    assert [len(o.token_ids) for o in outputs] == [4, 4, 0, 0, 0]


def test_a_prompt_that_fills_the_context_is_a_clear_error(policy):
    model, tokenizer = policy
    too_long = Request("long", [5] * model.config.max_position_embeddings)
    with pytest.raises(ValueError, match="leaves no room"):
        HFEngine(model, tokenizer).generate([too_long], SamplingParams())


def test_top_k_and_top_p_keep_exactly_the_tokens_they_should():
    logits = torch.log(torch.tensor([[0.5, 0.25, 0.15, 0.1]]))
    kept = lambda lp: torch.isfinite(lp[0]).nonzero().flatten().tolist()  # noqa: E731
    assert kept(processed_logprobs(logits, 1.0, top_k=2)) == [0, 1]
    # the top token alone reaches 0.5
    assert kept(processed_logprobs(logits, 1.0, top_p=0.5)) == [0]
    assert kept(processed_logprobs(logits, 1.0, top_p=0.7)) == [0, 1]
    assert kept(processed_logprobs(logits, 1.0, top_p=0.76)) == [0, 1, 2]
    renormalised = processed_logprobs(logits, 1.0, top_k=2)[0, :2].exp()
    torch.testing.assert_close(renormalised, torch.tensor([2 / 3, 1 / 3]))


@pytest.mark.parametrize("sync", ["merged", "adapter"])
def test_built_from_its_sections_the_engine_takes_each_published_version_from_its_feed(
    demo_policy, redis_cfg, sync
):
    """``HF.from_config`` reads ``model`` and ``actor`` only, and subscribes through the
    feed: full weights into the policy, or with ``model.lora.sync: adapter`` the adapters into a
    peft-wrapped copy of it."""
    from streamrl.actors.engines.base import EngineParts
    from streamrl.actors.engines.hf import HF
    from streamrl.configs.schema import ActorConfig, LoraConfig, ModelConfig
    from streamrl.policy import lora
    from streamrl.weightsync.feed import WeightFeed
    from streamrl.weightsync.publisher import Publisher

    lora_cfg = LoraConfig(rank=4, target_modules=["q_proj", "v_proj"], sync=sync)
    model = ModelConfig(path=demo_policy, lora=lora_cfg)
    ws = redis_cfg.weightsync.model_copy(update={"transport": "shm"})
    feed = WeightFeed.from_config(ws, redis_cfg.broker, redis_cfg.run, "a0")
    parts = EngineParts(feed, load_tokenizer(demo_policy), seed=0)
    engine = HF.from_config(parts, model=model, actor=ActorConfig(batch_slots=4))
    learner = lora.wrap(load_policy(demo_policy), lora_cfg)
    with torch.no_grad():
        for name, p in learner.named_parameters():
            if "lora_B" in name:
                p.fill_(0.01)
    publisher = Publisher.from_config(ws, redis_cfg.broker, redis_cfg.run)
    try:
        publisher.publish(1, lora.published_tensors(learner, lora_cfg))
        deadline = time.monotonic() + 60
        while engine.version != 1:
            assert time.monotonic() < deadline, "the engine never took version 1"
            engine.maybe_swap_weights()
            time.sleep(0.01)
        ids = torch.tensor([load_tokenizer(demo_policy)("314>")["input_ids"]])
        exact = copy.deepcopy(learner).double()
        with torch.no_grad():
            served = engine.model(input_ids=ids).logits
            trained, trained64 = learner(input_ids=ids).logits, exact(input_ids=ids).logits
            before = load_policy(demo_policy)(input_ids=ids).logits
        assert_within_rounding(served, trained, trained64)
        # the version moved the policy well past rounding: the engine serves it, not the base
        assert (trained - before).abs().max() > 100 * (trained - trained64).abs().max()
    finally:
        engine.close()
        publisher.close()
