"""The vLLM actor engine against the real vLLM CPU build (``make .venv-vllm``): one AsyncLLM for the module.

Weights reach it the way they do in a run: a real learner-side publisher writes
versions into shared memory and announces them in Redis; the engine follows the
announcements and its workers load each slot through the ``streamrl_shm``
backend. Every check compares vLLM's behaviour log-probs with the learner's own
``token_logprobs`` on the weights of the version vLLM names, computed in float64, within
the rounding the learner's own float32 evaluation shows (``tests/rounding.py``).
"""

from __future__ import annotations

import os
import signal
import uuid
from dataclasses import replace

import numpy as np
import pytest
import torch
from prometheus_client import REGISTRY

if not os.environ.get("STREAMRL_REQUIRE_VLLM"):
    pytest.importorskip("vllm", reason="the vLLM CPU build lives in .venv-vllm (make test-vllm)")

from rounding import (  # noqa: E402
    assert_within_rounding,
    learner_logprobs_twice,
    parameters_from,
)
from waiting import until

from streamrl.actors.engines.base import EngineParts, Output, Request, SamplingParams  # noqa: E402
from streamrl.actors.engines.vllm import VLLM  # noqa: E402
from streamrl.actors.engines.vllm.push import EngineFailed  # noqa: E402
from streamrl.broker.client import connect_sync  # noqa: E402
from streamrl.broker.keys import Keys  # noqa: E402
from streamrl.configs import Config  # noqa: E402
from streamrl.learner.batching import Sample, collate  # noqa: E402
from streamrl.learner.export import export_policy  # noqa: E402
from streamrl.policy.load import load_policy, load_tokenizer  # noqa: E402
from streamrl.policy.logprobs import Sampling  # noqa: E402
from streamrl.weightsync.announce import read_announcement  # noqa: E402
from streamrl.weightsync.feed import WeightFeed  # noqa: E402
from streamrl.weightsync.publisher import Publisher  # noqa: E402

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

# the module's one engine starts in its first test's setup: 30-60 s on an idle 2-core machine, minutes
# on a loaded one (a hang guard, not a speed target)
pytestmark = pytest.mark.timeout(900)

PROMPTS = ["314>", "12>", "98765>", "1>", "4444>", "70>", "5>", "271>"]


def _config(redis_url: str, policy: str, run_dir) -> Config:
    return Config.model_validate(
        {
            "run": {"name": f"vllm-{uuid.uuid4().hex[:10]}", "dir": str(run_dir)},
            "broker": {"redis_url": redis_url},
            "model": {"path": policy},
            "actor": {"engine": "vllm", "batch_slots": 32},
            "weightsync": {"transport": "shm", "timeout_s": 60},
        }
    )


class Rig:
    """The engine under test, the learner's model per version, and the publisher feeding the engine."""

    def __init__(self, cfg: Config, policy: str) -> None:
        self.cfg = cfg
        self.tokenizer = load_tokenizer(policy)
        self.base = {n: p.detach().clone() for n, p in load_policy(policy).named_parameters()}
        self.models = (load_policy(policy), load_policy(policy, torch.float64))
        self.weights = {0: self.base}
        self.publisher = Publisher.from_config(cfg.weightsync, cfg.broker, cfg.run)
        feed = WeightFeed.from_config(cfg.weightsync, cfg.broker, cfg.run, "a0")
        parts = EngineParts(feed, self.tokenizer, seed=0)
        self.engine = VLLM.from_config(parts, model=cfg.model, actor=cfg.actor)

    def versioned(self, version: int, only: str | None = None) -> dict[str, torch.Tensor]:
        gen = torch.Generator().manual_seed(version)
        return {
            n: p + (0.3 * torch.randn(p.shape, generator=gen) if only is None or only in n else 0)
            for n, p in self.base.items()
        }

    def publish(self, version: int, only: str | None = None, wait: bool = True) -> None:
        tensors = self.versioned(version, only)
        self.weights[version] = tensors
        self.publisher.publish(version, {"module." + n: t for n, t in tensors.items()})
        if wait:
            until(lambda: self.engine.version == version)

    def learner_logprobs(
        self, version: int, request: Request, output: Output, temperature: Sampling | float
    ) -> tuple[np.ndarray, np.ndarray]:
        """The learner's log-probs of the sampled tokens under ``version``'s weights, in float32
        and in float64."""
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
        load = parameters_from(self.weights[version])
        return learner_logprobs_twice(self.models, load, batch, temperature)

    def requests(self, n: int) -> list[Request]:
        return [
            Request(f"r{i}", self.tokenizer(PROMPTS[i % len(PROMPTS)])["input_ids"])
            for i in range(n)
        ]

    def close(self) -> None:
        self.engine.close()
        self.publisher.close()


def _push_failures() -> float:
    value = REGISTRY.get_sample_value(
        "streamrl_weights_transfer_failures_total", {"reason": "engine_push"}
    )
    return value or 0.0


def _exported_policy(policy: str, out) -> str:
    """The demo policy moved off its initial weights (a trained policy's stand-in), written the way
    ``learner.export`` writes a run's policy."""
    model = load_policy(policy)
    gen = torch.Generator().manual_seed(1234)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.1 * torch.randn(param.shape, generator=gen))
    return str(export_policy(model, load_tokenizer(policy), out, {"step": 0, "version": 0}))


@pytest.fixture(scope="module")
def rig(redis_server, demo_policy, tmp_path_factory):
    # the engine starts from an exported policy, so every version-0 check below also shows that
    # vLLM loads what learner.export writes exactly as transformers does
    policy = _exported_policy(demo_policy, tmp_path_factory.mktemp("export") / "policy")
    rig = Rig(_config(redis_server.url, policy, tmp_path_factory.mktemp("run")), policy)
    try:
        yield rig
    finally:
        rig.close()


def _assert_matches_learner(rig: Rig, requests, outputs, temperature: Sampling | float) -> None:
    for request, output in zip(requests, outputs, strict=True):
        assert len(output.token_ids) > 0
        versions = output.versions.tolist()
        for version in sorted(set(versions)):
            float32, float64 = rig.learner_logprobs(version, request, output, temperature)
            mask = output.versions == version
            assert_within_rounding(output.logprobs[mask], float32[mask], float64[mask])


@pytest.mark.parametrize(
    "sampling",
    [Sampling(1.0), Sampling(0.7), Sampling(0.8, top_k=5, top_p=0.9)],
    ids=["t1", "t0.7", "top_k_top_p"],
)
def test_behaviour_logprobs_equal_the_learners_on_the_same_weights(rig, sampling):
    """vLLM's processed log-probs are the learner's scores, top-k and top-p included: mu is the
    distribution the learner scores under (docs/guarantees.md, "What mu is")."""
    requests = rig.requests(16)
    params = SamplingParams(
        max_new_tokens=12,
        temperature=sampling.temperature,
        top_k=sampling.top_k,
        top_p=sampling.top_p,
    )
    outputs = rig.engine.generate(requests, params)
    assert [o.request_id for o in outputs] == [r.request_id for r in requests]
    assert all(set(o.versions.tolist()) == {rig.engine.version} for o in outputs)
    _assert_matches_learner(rig, requests, outputs, sampling)


def test_a_pushed_version_is_served_and_its_tied_lm_head_follows_the_embedding(rig):
    # only the input embedding changes; the demo model ties the LM head to it
    version = rig.engine.version + 1
    rig.publish(version, only="embed_tokens")
    requests = rig.requests(8)
    outputs = rig.engine.generate(requests, SamplingParams(max_new_tokens=12))
    assert all(set(o.versions.tolist()) == {version} for o in outputs)
    _assert_matches_learner(rig, requests, outputs, 1.0)


class _PublishWhileGenerating:
    """A ``should_abort`` that never aborts and publishes ``version`` at its second poll.

    The engine polls it between generation steps: the second poll comes after the first tokens
    were sampled, with at least one completion unfinished. Publishing there puts the push inside
    the generation, instead of racing a thread's start against a sleep."""

    def __init__(self, rig: Rig, version: int) -> None:
        self.rig, self.version, self.polls = rig, version, 0

    @property
    def published(self) -> bool:
        return self.polls >= 2

    def __call__(self) -> bool:
        self.polls += 1
        if self.polls == 2:
            self.rig.publish(self.version, wait=False)
        return False


def test_a_push_during_generation_tags_each_span_with_the_weights_that_produced_it(rig):
    requests = rig.requests(32)
    params = SamplingParams(max_new_tokens=48, temperature=1.0)
    for _attempt in range(3):
        # From a wholly perturbed version the policy is near-random: completions run for tens of
        # tokens instead of the trained policy's handful, so generation outlasts a push by far.
        before = rig.engine.version + 1
        rig.publish(before)
        hook = _PublishWhileGenerating(rig, before + 1)
        outputs = rig.engine.generate(requests, params, should_abort=hook)
        if hook.published:
            until(lambda b=before: rig.engine.version == b + 1)
        straddling = [o for o in outputs if len(set(o.versions.tolist())) > 1]
        if straddling:
            break
    assert straddling, "no completion straddled a push in 3 tries"
    for output in straddling:
        versions = output.versions.tolist()
        assert versions == sorted(versions) and set(versions) <= {before, before + 1}
    _assert_matches_learner(rig, requests, outputs, 1.0)


def test_a_push_failing_half_way_keeps_the_previous_version_and_the_next_push_succeeds(
    rig, tmp_path
):
    live = rig.engine.version
    failures = _push_failures()
    # version live+1 sits in a segment of its own, announced under another run's keys (so the engine
    # does not follow it); its layout renames layer 0's v_proj: the workers buffer q and k of layer
    # 0's fused qkv, then fail with the rest of the model on meta. The restore must not mix the
    # buffered q and k into the next push
    other = rig.cfg.model_copy(
        update={"run": rig.cfg.run.model_copy(update={"name": f"other-{uuid.uuid4().hex[:8]}"})}
    )
    side = Publisher.from_config(other.weightsync, other.broker, other.run)
    try:
        side.publish(live + 1, {"module." + n: t for n, t in rig.versioned(live + 1).items()})
        ann = read_announcement(
            connect_sync(other.broker, other.run.dir), Keys.from_config(other.run, other.broker)
        )
        layout = [list(spec) for spec in ann.meta["layout"]]
        names = [spec[0] for spec in layout]
        layout[names.index("model.layers.0.self_attn.v_proj.weight")][0] = "model.no_such.weight"
        broken = replace(ann, meta={**ann.meta, "layout": layout})
        assert not rig.engine._call(rig.engine.push_announcement(broken))
    finally:
        side.close()
    assert rig.engine.version == live and rig.engine.failed is None
    assert _push_failures() == failures + 1
    requests = rig.requests(8)
    outputs = rig.engine.generate(requests, SamplingParams(max_new_tokens=12))
    assert all(set(o.versions.tolist()) == {live} for o in outputs)
    _assert_matches_learner(rig, requests, outputs, 1.0)
    rig.publish(live + 1)
    outputs = rig.engine.generate(requests, SamplingParams(max_new_tokens=12))
    assert all(set(o.versions.tolist()) == {live + 1} for o in outputs)
    _assert_matches_learner(rig, requests, outputs, 1.0)


class _StopAtSecondPoll:
    """A ``should_abort`` that asks to stop at its second poll.

    The engine polls only while a request is unfinished, and its second poll comes one poll
    interval after the first, once every request was submitted: a stop there finds requests in
    flight by construction, instead of after a wall-clock delay that a fast CPU outruns."""

    def __init__(self) -> None:
        self.polls = 0

    def __call__(self) -> bool:
        self.polls += 1
        return self.polls >= 2


def test_a_refill_keeps_the_engine_busy_and_each_request_is_reported_as_it_ends(rig):
    first, later = rig.requests(8)[:4], rig.requests(8)[4:]
    offered = [later]

    def refill(room: int):
        assert room > 0
        return offered.pop() if offered else []

    finished = {}
    outputs = rig.engine.generate(
        first,
        SamplingParams(max_new_tokens=8),
        refill=refill,
        on_finished=lambda index, output: finished.setdefault(index, output),
    )
    # the refilled requests' outputs follow the given ones', each heard of as it ended
    assert [o.request_id for o in outputs] == [r.request_id for r in first + later]
    assert sorted(finished) == list(range(8))
    for index, output in finished.items():
        assert output.token_ids.tolist() == outputs[index].token_ids.tolist()
    _assert_matches_learner(rig, first + later, outputs, 1.0)


def test_a_stop_aborts_the_requests_in_flight_without_an_error(rig):
    # a near-random version: completions run to max_new_tokens, far past one poll interval
    rig.publish(rig.engine.version + 1)
    for _attempt in range(3):
        hook = _StopAtSecondPoll()
        outputs = rig.engine.generate(
            rig.requests(64), SamplingParams(max_new_tokens=48, temperature=1.0), should_abort=hook
        )
        if hook.polls >= 2:
            break
    assert hook.polls >= 2, "every request finished within one poll interval, 3 times"
    assert len(outputs) == 64 and {o.finish_reason for o in outputs} <= {"abort", "length", "stop"}
    assert any(o.finish_reason == "abort" for o in outputs)


def test_a_dead_engine_fails_generation_loudly_instead_of_returning_empty_output(rig):
    import psutil

    cores = [
        p
        for p in psutil.Process().children(recursive=True)
        if "EngineCore" in " ".join(p.cmdline()) or "EngineCore" in p.name()
    ]
    assert cores, "no vLLM engine core process found"
    for core in cores:
        os.kill(core.pid, signal.SIGKILL)
    with pytest.raises(EngineFailed):
        rig.engine.generate(rig.requests(4), SamplingParams(max_new_tokens=8))
