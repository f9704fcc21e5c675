"""Each rollout source on its own, built from only the sections it reads, against a real Redis
(admission and the prompt cursor) and the real hf engine: what it yields is what the actor
scores and publishes."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import uuid

import aiohttp
import pytest
from multiturn_envs import FEEDBACK, terse_tokenizer

from streamrl.actors.admit import Admit
from streamrl.actors.engines.base import SamplingParams
from streamrl.actors.engines.hf.engine import HFEngine
from streamrl.actors.prompt_data import PromptCursor, PromptDataset
from streamrl.actors.sources import Generation
from streamrl.actors.sources.agent import AgentSource
from streamrl.actors.sources.environment import EnvironmentSource
from streamrl.actors.sources.prompts import PromptsSource
from streamrl.broker.admission import Admission, Bounds
from streamrl.broker.client import connect_async
from streamrl.broker.keys import Keys
from streamrl.configs.schema import (
    ActorConfig,
    AgentConfig,
    BrokerConfig,
    EnvConfig,
    ModelConfig,
    RolloutConfig,
    RunConfig,
)
from streamrl.policy.load import load_policy

GROUP = 4
# admission's bound with no learner: (max_staleness + 1) * groups_per_step groups
BOUND = 64


class Counting(HFEngine):
    """The hf engine, counting its ``generate`` calls (one per batch unless refills keep it going)."""

    calls = 0

    def generate(self, *args, **kwargs):
        self.calls += 1
        return super().generate(*args, **kwargs)


@contextlib.asynccontextmanager
async def admitting(redis_server, engine, dataset):
    """An ``Admit`` over the session Redis, for a run of its own, and its admission."""
    broker = BrokerConfig(redis_url=redis_server.url)
    redis = connect_async(broker, "unused")
    keys = Keys.from_config(RunConfig(name=f"sources-{uuid.uuid4().hex[:8]}"), broker)
    admission = Admission(redis, keys, Bounds(0, 1, BOUND), lease_ttl_s=60)
    cursor = PromptCursor(dataset, redis, keys.prompts_cursor, seed=0)
    admit = Admit(admission, cursor, engine, "a0", threading.Event())
    try:
        yield admit, admission
    finally:
        await redis.aclose()


async def take(source, admit: Admit, count: int) -> list:
    """What the source yields: ``count`` groups, then the actor stops (groups completed by then
    still come)."""
    groups = []
    async with contextlib.aclosing(source.groups(admit)) as rolled_out:
        async for group in rolled_out:
            groups.append(group)
            if len(groups) == count:
                admit.stop.set()
    return groups


@pytest.fixture(scope="module")
def hf(demo_policy):
    return load_policy(demo_policy), terse_tokenizer(demo_policy)


def _gen(engine, tokenizer, max_new_tokens: int = 4) -> Generation:
    params = SamplingParams(max_new_tokens=max_new_tokens, stop_token_ids=(tokenizer.eos_token_id,))
    return Generation(engine, "a0", params, tokenizer, GROUP)


@pytest.mark.parametrize("refill", [True, False])
def test_the_prompts_source_yields_each_group_complete_and_refills_freed_slots(
    hf, demo_dataset, redis_server, refill
):
    model, tokenizer = hf
    engine = Counting(model, tokenizer, batch_slots=2 * GROUP, seed=0)
    source = PromptsSource.from_config(
        _gen(engine, tokenizer), actor=ActorConfig(batch_slots=2 * GROUP, refill=refill)
    )
    dataset = PromptDataset(demo_dataset, tokenizer)

    async def run():
        async with admitting(redis_server, engine, dataset) as (admit, admission):
            groups = await take(source, admit, 6)
            leases = (await admission.counts())["leases"]
            held = set(admit.leases)
            await admit.release_all()
            return groups, leases, held

    groups, leases, held = asyncio.run(run())
    assert len(groups) >= 6
    for group in groups:
        assert len(group.samples) == GROUP
        for sample in group.samples:
            tokens = sample.output.token_ids.tolist()
            turn = sample.reward_input.messages[-1]
            assert sample.reward_input.messages[:-1] == group.prompt.messages
            assert turn["content"] == tokenizer.decode(tokens, skip_special_tokens=True)
            assert sample.reward_input.completion_ids == tokens
            assert sample.output.finish_reason in ("stop", "length")
    # the groups the stop cut short were released: only the yielded ones hold a lease
    assert held == {g.lease_id for g in groups} and leases == len(groups)
    # two groups fill the batch: with refill one generation went on through all six
    assert engine.calls == 1 if refill else engine.calls >= 3


@pytest.mark.parametrize(
    ("limits", "expected"),
    [
        # Feedback is done at its third step, with reward 1: the environment's part "env"
        ({"max_turns": 4}, {"bonus": {"env": 1.0}, "end": "done"}),
        # cut at two turns: the trajectory is scored env.truncated_reward, nothing else runs
        ({"max_turns": 2, "truncated_reward": -1.0}, {"score": -1.0, "end": "max_turns"}),
    ],
)
def test_the_environment_source_yields_trajectories_with_their_environments_rewards(
    hf, demo_dataset, redis_server, limits, expected
):
    model, tokenizer = hf
    engine = HFEngine(model, tokenizer, batch_slots=2 * GROUP, seed=1)
    env = EnvConfig(name="multiturn_envs:Feedback", max_total_tokens=60, **limits)
    source = EnvironmentSource.from_config(
        _gen(engine, tokenizer, 6), env=env, actor=ActorConfig(batch_slots=2 * GROUP)
    )
    dataset = PromptDataset(demo_dataset, tokenizer)

    async def run():
        async with admitting(redis_server, engine, dataset) as (admit, _):
            groups = await take(source, admit, 1)
            await admit.release_all()
            return groups

    group = asyncio.run(run())[0]
    assert group.env["turns"] == GROUP * (3 if expected["end"] == "done" else 2)
    for sample in group.samples:
        assert sample.output.meta["end"] == expected["end"]
        mask = sample.output.meta["loss_mask"]
        assert len(mask) == len(sample.output.token_ids) and 0 < mask.sum() < len(mask)
        if "score" in expected:
            assert sample.reward_input is None and sample.score.total == expected["score"]
        else:
            # the reward functions see the whole conversation, the environment's turns included
            assert sample.bonus == expected["bonus"]
            messages = sample.reward_input.messages
            assert [m["role"] for m in messages[-2:]] == ["user", "assistant"]
            assert messages[-2] == FEEDBACK[0]


def test_the_agent_source_yields_a_group_once_its_agent_closed_every_trajectory(
    hf, demo_dataset, demo_policy, redis_server, tmp_path
):
    model, tokenizer = hf
    engine = HFEngine(model, tokenizer, batch_slots=2 * GROUP, seed=2)
    source = AgentSource.from_config(
        _gen(engine, tokenizer),
        # this agent reports rewards 0, 1, 2 for all but its last trajectory
        agent=AgentConfig(enabled=True, trust_reported_reward=True, reward_range=(0.0, 2.0)),
        run=RunConfig(dir=str(tmp_path)),
        model=ModelConfig(path=demo_policy),
        rollout=RolloutConfig(group_size=GROUP),
    )
    dataset = PromptDataset(demo_dataset, tokenizer)

    async def agent(base_url: str, token: str) -> list[dict]:
        """Open a group, complete each trajectory once, close it with reward j (the last: none)."""
        auth = {"Authorization": f"Bearer {token}"}
        async with aiohttp.ClientSession(headers=auth) as http:
            while True:
                async with http.post(f"{base_url}/groups", json={}) as r:
                    if r.status == 200:
                        opened = await r.json()
                        break
                await asyncio.sleep(0.1)
            prompt = opened["task"]["messages"][0]["content"]
            closed = []
            for j, t in enumerate(opened["trajectories"]):
                body = {"prompt": prompt, "max_tokens": 3}
                async with http.post(f"{t['base_url']}/completions", json=body) as r:
                    assert r.status == 200, await r.text()
                # the last close waits until the actor has published the group (or not)
                reward = {"reward": None if j == GROUP - 1 else float(j)}
                async with http.post(f"{base_url}/trajectories/{t['id']}/reward", json=reward) as r:
                    closed.append(await r.json())
            return closed

    async def run():
        async with admitting(redis_server, engine, dataset) as (admit, _):
            groups = source.groups(admit)
            served = asyncio.ensure_future(groups.__anext__())
            agent_dir = tmp_path / "agent"
            while not (agent_dir / "a0.url").exists():
                await asyncio.sleep(0.05)
            base_url = (agent_dir / "a0.url").read_text().strip()
            token = (agent_dir / "a0.token").read_text().strip()
            answers = asyncio.ensure_future(agent(base_url, token))
            group = await served
            # the actor published it: the agent's last close hears so
            group.settle(True)
            closed = await answers
            admit.stop.set()
            await groups.aclose()
            await admit.release_all()
            return group, closed

    group, closed = asyncio.run(run())
    assert [c["group_complete"] for c in closed] == [False] * (GROUP - 1) + [True]
    assert closed[-1]["published"]
    given = [s.score.total for s in group.samples[:-1]]
    assert given == [0.0, 1.0, 2.0]
    assert all(
        s.reward_input is None and s.score.parts == {"agent": s.score.total}
        for s in group.samples[:-1]
    )
    # left to the reward functions: the recorded completion after the task's prompt
    last = group.samples[-1]
    assert last.score is None and last.reward_input.messages[-1]["role"] == "assistant"
    assert group.prompt_token_ids == tokenizer.encode(
        group.prompt.messages[0]["content"], add_special_tokens=False
    )
