"""LoRA adapter versions in a running vLLM engine (the real CPU build, ``make .venv-vllm``): one engine.

Adapters travel as in a run (``model.lora.sync: adapter``): a learner-side publisher writes each
version's adapter tensors into shared memory, the actor's subscriber stages them and the engine
loads them as a new LoRA adapter without restarting. Every check compares vLLM's behaviour
log-probs with the learner's ``token_logprobs`` under the merged weights of the version vLLM names.
"""

from __future__ import annotations

import os
import uuid

import numpy as np
import pytest
import torch

if not os.environ.get("STREAMRL_REQUIRE_VLLM"):
    pytest.importorskip("vllm", reason="the vLLM CPU build lives in .venv-vllm (make test-vllm)")

from rounding import assert_within_rounding, learner_logprobs_twice, rounding_tolerance  # noqa: E402
from waiting import until

from streamrl.actors.engines.base import EngineParts, Output, Request, SamplingParams  # noqa: E402
from streamrl.actors.engines.vllm.engine import VLLMEngine  # noqa: E402
from streamrl.configs import Config  # noqa: E402
from streamrl.learner.batching import Sample, collate  # noqa: E402
from streamrl.policy import lora as L  # noqa: E402
from streamrl.policy.load import load_policy, load_tokenizer  # noqa: E402
from streamrl.weightsync.feed import WeightFeed  # noqa: E402
from streamrl.weightsync.publisher import Publisher  # noqa: E402

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

# the engine starts in the first test's setup (a hang guard, not a speed target)
pytestmark = pytest.mark.timeout(900)

PROMPTS = ["314>", "12>", "98765>", "1>", "4444>", "70>", "5>", "271>"]


def _config(redis_url: str, policy: str, run_dir) -> Config:
    return Config.model_validate(
        {
            "run": {"name": f"vllm-lora-{uuid.uuid4().hex[:10]}", "dir": str(run_dir)},
            "broker": {"redis_url": redis_url},
            "model": {
                "path": policy,
                "lora": {
                    "rank": 8,
                    "alpha": 16,
                    "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"],
                    "sync": "adapter",
                },
            },
            "actor": {"engine": "vllm", "batch_slots": 32},
            "weightsync": {"transport": "shm", "timeout_s": 60},
        }
    )


class Rig:
    """The engine under test, the learner's LoRA policy, and the publisher and subscriber feeding it."""

    def __init__(self, cfg: Config, policy: str) -> None:
        self.cfg = cfg
        self.tokenizer = load_tokenizer(policy)
        learner = L.wrap(load_policy(policy), cfg.model.lora)
        self.adapters = {0: {n: t.clone() for n, t in L.adapter_tensors(learner).items()}}
        self.learners = (learner, L.wrap(load_policy(policy, torch.float64), cfg.model.lora))
        self.publisher = Publisher.from_config(cfg.weightsync, cfg.broker, cfg.run)
        feed = WeightFeed.from_config(cfg.weightsync, cfg.broker, cfg.run, "a0")
        parts = EngineParts(feed, self.tokenizer, seed=0)
        self.engine = VLLMEngine.from_config(parts, model=cfg.model, actor=cfg.actor)

    def publish(self, version: int, wait: bool = True) -> None:
        # a version = random adapters, large enough that the policy visibly moves off the base
        gen = torch.Generator().manual_seed(version)
        self.adapters[version] = {
            n: 0.3 * torch.randn(t.shape, generator=gen) for n, t in self.adapters[0].items()
        }
        self.publisher.publish(version, self.adapters[version])
        if wait:
            until(lambda: self.engine.version == version)

    def learner_logprobs(
        self, version: int, request: Request, output: Output
    ) -> tuple[np.ndarray, np.ndarray]:
        """The learner's log-probs of the sampled tokens under ``version``'s adapters, in float32
        and in float64."""

        def load(learner) -> None:
            targets = L.adapter_targets(learner)
            for name, tensor in self.adapters[version].items():
                targets[name].copy_(tensor)

        prompt = np.asarray(request.prompt_token_ids, dtype=np.int64)
        sample = Sample(
            np.concatenate([prompt, output.token_ids.astype(np.int64)]),
            len(prompt),
            output.logprobs,
            output.versions.astype(np.int64),
            0.0,
            0.0,
            "g",
        )
        batch = collate([sample], self.tokenizer.pad_token_id or 0)
        return learner_logprobs_twice(self.learners, load, batch, 1.0)

    def requests(self, n: int) -> list[Request]:
        return [
            Request(f"r{i}", self.tokenizer(PROMPTS[i % len(PROMPTS)])["input_ids"])
            for i in range(n)
        ]

    def close(self) -> None:
        self.engine.close()
        self.publisher.close()


@pytest.fixture(scope="module")
def rig(redis_server, demo_policy, tmp_path_factory):
    rig = Rig(_config(redis_server.url, demo_policy, tmp_path_factory.mktemp("run")), demo_policy)
    try:
        yield rig
    finally:
        rig.close()


def _assert_matches_learner(rig: Rig, requests, outputs) -> None:
    for request, output in zip(requests, outputs, strict=True):
        assert len(output.token_ids) > 0
        (version,) = set(output.versions.tolist())
        assert_within_rounding(output.logprobs, *rig.learner_logprobs(version, request, output))


def test_each_version_is_loaded_as_an_adapter_and_served(rig):
    params = SamplingParams(max_new_tokens=12)
    requests = rig.requests(8)
    base = rig.engine.generate(requests, params)
    assert all(set(o.versions.tolist()) == {0} for o in base)
    _assert_matches_learner(rig, requests, base)
    for version in (1, 2):
        rig.publish(version)
        outputs = rig.engine.generate(requests, params)
        assert all(set(o.versions.tolist()) == {version} for o in outputs)
        _assert_matches_learner(rig, requests, outputs)
        # the adapter is really applied: the base policy scores these tokens differently, by far
        # more than rounding
        moved, tolerance = 0.0, 0.0
        for request, output in zip(requests, outputs, strict=True):
            float32, float64 = rig.learner_logprobs(0, request, output)
            moved = max(moved, np.abs(output.logprobs - float64).max())
            tolerance = max(tolerance, rounding_tolerance(float32, float64))
        assert moved > 100 * tolerance
    # older adapters no request uses are removed from the engine
    until(lambda: len(rig.engine.adapters.loaded) == 1)


class _PublishWhileGenerating:
    """A ``should_abort`` that never aborts and publishes ``version`` at its second poll, once
    the first tokens were sampled and completions are unfinished; ``swapped`` says whether the
    engine served ``version`` while the generation still ran."""

    def __init__(self, rig: Rig, version: int) -> None:
        self.rig, self.version, self.polls, self.swapped = rig, version, 0, False

    def __call__(self) -> bool:
        self.polls += 1
        if self.polls == 2:
            self.rig.publish(self.version, wait=False)
        self.swapped = self.swapped or self.rig.engine.version == self.version
        return False


def test_generation_continues_across_a_swap_each_request_on_its_own_version(rig):
    requests = rig.requests(16)
    params = SamplingParams(max_new_tokens=48)
    for _attempt in range(3):
        before = rig.engine.version + 1
        rig.publish(before)
        hook = _PublishWhileGenerating(rig, before + 1)
        outputs = rig.engine.generate(requests, params, should_abort=hook)
        if hook.swapped:
            break
        until(lambda b=before: rig.engine.version == b + 1)
    assert hook.swapped, "no adapter was loaded while a generation ran, in 3 tries"
    # requests that started under `before` ran to their end on it, past the swap
    assert all(o.finish_reason in ("stop", "length") for o in outputs)
    assert all(set(o.versions.tolist()) == {before} for o in outputs)
    _assert_matches_learner(rig, requests, outputs)
    later = rig.requests(8)
    outputs = rig.engine.generate(later, SamplingParams(max_new_tokens=12))
    assert all(set(o.versions.tolist()) == {before + 1} for o in outputs)
    _assert_matches_learner(rig, later, outputs)
