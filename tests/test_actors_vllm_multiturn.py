"""Multi-turn trajectories on the real vLLM CPU build (``make .venv-vllm``): an actor process, then
one engine for the rest of the module.

The actor (``actor.engine=vllm``) runs the demo's two-attempt environment and publishes its
trajectories with their loss masks, as the hf actor does (test_multiturn_actor).

Each turn is a request of the trajectory's token ids so far: the prefix cache serves the turns
before it, the trained sequence is the engine's tokens plus the environment's, token by token
through the wire and the learner's collate, and every model token's behaviour log-prob is the
learner's on the weights of the version it is tagged with, with a swap between turns and one
inside a turn. Weights reach the engine as in a run: a learner-side publisher writes each version
into shared memory and the engine's workers load it through the ``streamrl_shm`` backend.
"""

from __future__ import annotations

import os
import threading
import uuid

import numpy as np
import pytest
import torch

if not os.environ.get("STREAMRL_REQUIRE_VLLM"):
    pytest.importorskip("vllm", reason="the vLLM CPU build lives in .venv-vllm (make test-vllm)")

from multiturn_envs import ROW, env_rollouts, terse_tokenizer  # noqa: E402
from rounding import (  # noqa: E402
    assert_within_rounding,
    learner_logprobs_twice,
    parameters_from,
)
from test_multiturn_actor import check_multiturn_actor  # noqa: E402
from waiting import until

from streamrl.actors.engines.base import SamplingParams  # noqa: E402
from streamrl.actors.engines.vllm import engine_args  # noqa: E402
from streamrl.actors.engines.vllm.engine import VLLMEngine  # noqa: E402
from streamrl.actors.engines.vllm.plugin import SHM_BACKEND  # noqa: E402
from streamrl.actors.environment import Step  # noqa: E402
from streamrl.broker.wire import Completion, RolloutGroup, decode_group, encode_group  # noqa: E402
from streamrl.configs import Config  # noqa: E402
from streamrl.learner.batching import collate, samples_from_group  # noqa: E402
from streamrl.policy.load import load_policy  # noqa: E402
from streamrl.weightsync.feed import WeightFeed  # noqa: E402
from streamrl.weightsync.publisher import Publisher  # noqa: E402

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")

# the engine starts in the first test's setup (30-60 s idle, minutes loaded): a hang guard
pytestmark = pytest.mark.timeout(900)

# the CPU build's default block is 128 tokens, past the demo model's 64 positions: the prefix
# cache would never hold a whole block of a trajectory. 32 is the smallest its kernel takes
BLOCK = 32


class Rig:
    """The engine, the learner's model per version, and the publisher feeding the engine."""

    def __init__(self, cfg: Config, policy: str) -> None:
        self.tokenizer = terse_tokenizer(policy)
        self.base = {n: p.detach().clone() for n, p in load_policy(policy).named_parameters()}
        self.models = (load_policy(policy), load_policy(policy, torch.float64))
        self.weights = {0: self.base}
        self.publisher = Publisher.from_config(cfg.weightsync, cfg.broker, cfg.run)
        feed = WeightFeed.from_config(cfg.weightsync, cfg.broker, cfg.run, "a0")
        announcements = feed.announcements()
        args = engine_args(cfg.model, cfg.actor, SHM_BACKEND, gpu=False) | {"block_size": BLOCK}
        self.engine = VLLMEngine(args, announcements=announcements, timeout_s=60)

    def publish(self, version: int, wait: bool = True) -> None:
        # far from the trained policy: near-random turns that run to their token budget
        gen = torch.Generator().manual_seed(version)
        tensors = {n: p + 0.3 * torch.randn(p.shape, generator=gen) for n, p in self.base.items()}
        self.weights[version] = tensors
        self.publisher.publish(version, {"module." + n: t for n, t in tensors.items()})
        if wait:
            until(lambda: self.engine.version == version)

    def learner_logprobs(self, version: int, sample) -> tuple[np.ndarray, np.ndarray]:
        """The learner's log-probs of a decoded sample's trained tokens under ``version``, in
        float32 and in float64."""
        load = parameters_from(self.weights[version])
        return learner_logprobs_twice(self.models, load, collate([sample], 0), 1.0)

    def close(self) -> None:
        self.engine.close()
        self.publisher.close()


@pytest.fixture(scope="module")
def rig(redis_server, demo_policy, tmp_path_factory):
    cfg = Config.model_validate(
        {
            "run": {
                "name": f"vllm-mt-{uuid.uuid4().hex[:10]}",
                "dir": str(tmp_path_factory.mktemp("run")),
            },
            "broker": {"redis_url": redis_server.url},
            "model": {"path": demo_policy},
            "actor": {"engine": "vllm", "batch_slots": 16},
            "weightsync": {"transport": "shm", "timeout_s": 60},
        }
    )
    rig = Rig(cfg, demo_policy)
    try:
        yield rig
    finally:
        rig.close()


@pytest.mark.slow
def test_a_vllm_actor_publishes_masked_trajectories(redis_server, tmp_path, multiturn_policy):
    # first in the module: its actor's engine runs before the module's own one starts
    check_multiturn_actor(redis_server, tmp_path, multiturn_policy, "actor.engine=vllm")


class _Recording:
    """Hands every turn to the real engine and keeps, per session, what it was asked and answered."""

    def __init__(self, engine: VLLMEngine) -> None:
        self.engine = engine
        self.max_positions = engine.max_positions
        self.turns: dict[str, list] = {}

    def generate(self, requests, params, should_abort=None):
        outputs = self.engine.generate(requests, params, should_abort)
        for request, output in zip(requests, outputs, strict=True):
            self.turns.setdefault(request.session, []).append(
                (list(request.prompt_token_ids), output)
            )
        return outputs

    def end_sessions(self, sessions) -> None:
        self.engine.end_sessions(sessions)


class Feedback:
    """Answers each turn with ``reply``; done after ``turns`` turns. ``on_step(n)`` runs at the
    n-th step (1-based) first."""

    def __init__(self, reply: str, turns: int, on_step=None) -> None:
        self.reply, self.turns, self.on_step, self.steps = reply, turns, on_step, 0

    def reset(self, row):
        return row["messages"]

    def step(self, turn):
        self.steps += 1
        if self.on_step is not None:
            self.on_step(self.steps)
        if self.steps == self.turns:
            return Step(done=True)
        return Step(messages=[{"role": "user", "content": self.reply}])


def _roll_out(rig, row, factory, size: int, should_abort=None):
    """A group of ``size`` trajectories to their ends (12 tokens a turn at most)."""
    engine = _Recording(rig.engine)
    rollouts = env_rollouts(
        rig.tokenizer, factory, max_turns=4, max_total_tokens=60, step_timeout_s=300
    )
    group = rollouts.start_group(row, size)
    params = SamplingParams(max_new_tokens=12, stop_token_ids=(rig.tokenizer.eos_token_id,))
    assert rollouts.run(engine, group, params, should_abort)
    assert [t.end for t in group] == ["done"] * size
    return group, engine.turns, rollouts.renderer


def _decoded(t):
    """A trajectory through the wire and into the learner's sample (one completion)."""
    o = t.output("0")
    completion = Completion(
        o.token_ids, o.logprobs, o.versions, 0.0, o.finish_reason, loss_mask=o.meta["loss_mask"]
    )
    group = RolloutGroup("g", "row", "a", 0, np.asarray(t.prompt, np.int32), [completion])
    (sample,) = samples_from_group(decode_group(encode_group(group)), [1.0])
    return sample


def _check_trained_sequence(rig, t, turns, renderer, reply: str) -> None:
    """The decoded sample is, token by token, the engine's turns and the rendered observations,
    and each model token's behaviour log-prob is the learner's under the version it is tagged
    with (on the whole sequence before it)."""
    sample = _decoded(t)
    expected, mask, versions = list(t.prompt), [], []
    assert len(turns) == t.turns
    for n, (sent, out) in enumerate(turns):
        # each turn asked the engine to continue from exactly the tokens so far
        assert sent == expected
        expected += out.token_ids.tolist()
        mask += [1] * len(out.token_ids)
        versions += out.versions.tolist()
        if n + 1 < len(turns):
            env = renderer.observation(
                [{"role": "user", "content": reply}],
                int(out.token_ids[-1]),
                out.finish_reason == "stop",
            )
            expected += env
            mask += [0] * len(env)
            versions += [versions[-1]] * len(env)
    assert sample.input_ids.tolist() == expected
    assert sample.versions.tolist() == versions
    batch = collate([sample], 0)
    assert batch.completion_mask[0, len(t.prompt) - 1 :].tolist() == [bool(m) for m in mask]
    trained = sample.trained()
    tagged = sample.versions[trained]
    behaviour = sample.behaviour_logprobs[trained]
    for version in sorted(set(tagged.tolist())):
        at = tagged == version
        float32, float64 = rig.learner_logprobs(version, sample)
        assert_within_rounding(behaviour[at], float32[at], float64[at])


def test_a_turn_continues_from_the_blocks_of_the_turn_before_it(rig):
    # a first message that fills most of the first block, so turn 1's own tokens complete it
    row = {"messages": [{"role": "user", "content": "9" * (BLOCK - 6)}], "answer": ""}
    version = rig.engine.version + 1
    rig.publish(version)
    reply = "no"
    group, turns, renderer = _roll_out(rig, row, lambda: Feedback(reply, turns=2), size=4)
    prompt = len(group[0].prompt)
    assert prompt < BLOCK
    past_the_prompt = 0
    for t in group:
        (first, one), (_, two) = turns[t.session]
        # every whole block turn 1 computed (its prompt and its tokens but the last) was reused
        computed = len(first) + len(one.token_ids) - 1
        assert two.meta["cached_tokens"] >= computed // BLOCK * BLOCK
        past_the_prompt += computed >= BLOCK
        assert set(t.versions) == {version}
        _check_trained_sequence(rig, t, turns[t.session], renderer, reply)
    assert past_the_prompt, "no turn 1 ran past the first block"


class _PublishAtNextPoll:
    """A ``should_abort`` that never aborts; once armed, it publishes ``version`` at its next poll.

    The engine polls first as it submits a turn's requests; its weight task takes the
    announcement at its next look (``WEIGHT_POLL_S``) and pushes it while the turn generates,
    unless the turn ended first (then the test tries again)."""

    def __init__(self, rig: Rig) -> None:
        self.rig, self.version = rig, None

    def arm(self, version: int) -> None:
        self.version = version

    def __call__(self) -> bool:
        if self.version is not None:
            self.rig.publish(self.version, wait=False)
            self.version = None
        return False


def test_versions_across_a_swap_between_turns_and_one_inside_a_turn(rig):
    reply = "no"
    for _attempt in range(3):
        start = rig.engine.version + 1
        rig.publish(start)
        hook = _PublishAtNextPoll(rig)
        published: set[int] = set()
        once = threading.Lock()

        def on_step(n: int, start=start, hook=hook, published=published, once=once) -> None:
            # a group's environments step concurrently (env.max_concurrent_steps): one publishes
            with once:
                # between turns 1 and 2: the next version, served before turn 2 starts
                if n == 1 and start + 1 not in published:
                    published.add(start + 1)
                    rig.publish(start + 1)
                # turn 3: one more version, pushed while it generates
                if n == 2 and start + 2 not in published:
                    published.add(start + 2)
                    hook.arm(start + 2)

        # one environment per group member; the first to step publishes
        group, turns, renderer = _roll_out(
            rig, ROW, lambda on_step=on_step: Feedback(reply, 3, on_step), 8, hook
        )
        until(lambda start=start: rig.engine.version == start + 2)
        straddling = 0
        for t in group:
            (_, one), (_, two), (_, three) = turns[t.session]
            assert set(one.versions.tolist()) == {start}
            assert set(two.versions.tolist()) == {start + 1}
            third = three.versions.tolist()
            assert third == sorted(third) and set(third) <= {start + 1, start + 2}
            straddling += len(set(third)) == 2
            _check_trained_sequence(rig, t, turns[t.session], renderer, reply)
        if straddling:
            return
    pytest.fail("no turn 3 straddled a push in 3 tries")
