"""Well-formed but hostile stream entries: each is dead-lettered with its reason, through the real
learner (which keeps stepping), and an entry that is never trained stops being redelivered."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib

import numpy as np
import pytest
import redis
from broker_helpers import VOCAB, limits_of, make_group
from learner_rollouts import xadd_groups
from test_learner_processes import GROUPS_PER_STEP, _config, _steps_logged, _stream_of

from streamrl.actors.rewards import BUILTINS, resolve, score_sample
from streamrl.broker.client import connect_async
from streamrl.broker.keys import Keys
from streamrl.broker.semantics import Limits, check_group
from streamrl.broker.stream import RolloutConsumer
from streamrl.broker.wire import Completion, WireError, encode_group
from streamrl.configs import load_config
from streamrl.configs.schema import BUILTIN_REWARD_RANGES, BrokerConfig

LIMITS = Limits(group_size=2, max_completion_tokens=8, max_prompt_tokens=16, max_abs_reward=1e6)


def _with(group, **changes):
    return dataclasses.replace(group, **changes)


def _long_completion(c: Completion, n: int) -> Completion:
    return Completion(
        np.full(n, c.token_ids[0], np.int32),
        np.full(n, -1.0, np.float32),
        np.zeros(n, np.int32),
        0.0,
    )


def _hostile(group, max_new_tokens: int) -> dict[str, tuple[object, str]]:
    """Variants of a valid group, each breaking one limit, with the words its reason must carry."""
    comps = group.completions
    return {
        "completion_too_long": (
            _with(group, completions=[_long_completion(comps[0], max_new_tokens + 1), *comps[1:]]),
            "rollout.max_new_tokens",
        ),
        "group_of_one": (_with(group, completions=comps[:1]), "rollout.group_size"),
        "group_too_big": (_with(group, completions=comps * 4), "rollout.group_size"),
        "future_version": (
            _with(
                group,
                completions=[
                    dataclasses.replace(c, versions=np.full(len(c), 3_795_627, np.int32))
                    for c in comps
                ],
            ),
            "never announced",
        ),
        "huge_reward": (
            _with(group, completions=[dataclasses.replace(comps[0], reward=1e308), *comps[1:]]),
            "broker.max_abs_reward",
        ),
        "huge_negative_reward": (
            _with(group, completions=[*comps[:-1], dataclasses.replace(comps[-1], reward=-1e308)]),
            "broker.max_abs_reward",
        ),
        "long_prompt": (
            _with(group, prompt_token_ids=np.ones(1024, np.int32)),
            "rollout.max_prompt_tokens",
        ),
    }


def test_each_limit_is_checked_and_named():
    group = make_group("g", n_completions=2, length=4, version=3)
    check_group(group, LIMITS, max_version=3)
    for bad, reason in _hostile(group, LIMITS.max_completion_tokens).values():
        with pytest.raises(WireError, match=reason.replace(".", r"\.")):
            check_group(bad, LIMITS, max_version=3)
    check_group(_hostile(group, 8)["future_version"][0], LIMITS, max_version=None)


def test_a_group_without_reference_logprobs_fails_where_the_actors_were_to_send_them():
    group = make_group("g", n_completions=2, length=4, version=3)
    needs = dataclasses.replace(LIMITS, needs_ref_logprobs=True)
    with pytest.raises(WireError, match=r"completion\[0\]: no reference log-probs.*reference_on"):
        check_group(group, needs, max_version=3)
    for c in group.completions:
        c.ref_logprobs = c.logprobs.copy()
    check_group(group, needs, max_version=3)


def _scored(group, reward: float, parts: dict[str, float]):
    return _with(
        group,
        completions=[
            dataclasses.replace(c, reward=reward, reward_parts=dict(parts))
            for c in group.completions
        ],
    )


def test_rewards_and_parts_are_held_to_their_declared_ranges():
    cfg = load_config("configs/demo_cpu.yaml", [], env={})
    limits = limits_of(cfg)
    group = make_group("g", n_completions=cfg.rollout.group_size, length=4)
    check_group(_scored(group, 1.0, {"reverse_digits_exact": 1.0}), limits)
    # a fuzz's group: under the old bound of 1e6, it moved the demo's 20-step means past the target
    hostile = {
        "both": (9.9e5, {"reverse_digits_exact": 9.9e5}, r"completion\[0\]\.r: reward 990000"),
        "reward": (1.5, {}, r"\.r: reward 1\.5 outside its range \[0, 1\]"),
        "part": (0.5, {"reverse_digits_exact": -0.1}, "'reverse_digits_exact'.*outside"),
        # a function's dict parts are held to its range
        "key": (0.5, {"reverse_digits/stop": 2.0}, "'reverse_digits/stop'.*outside"),
    }
    for reward, parts, reason in hostile.values():
        with pytest.raises(WireError, match=reason):
            check_group(_scored(group, reward, parts), limits)
    # the total's range: the weighted functions' (math + 0.1 x think_format), 0 (a failed function)
    # and an agent's own reward
    ranges = load_config("configs/gpu.yaml", ["agent.enabled=true"], env={}).reward_ranges
    assert ranges["reward"] == pytest.approx((0.0, 2.1)) and ranges["agent"] == (0.0, 1.0)
    # a part no function declares keeps broker.max_abs_reward, no longer 1e6
    assert BrokerConfig().max_abs_reward <= 100
    with pytest.raises(WireError, match="'other'.*outside"):
        check_group(_scored(group, 0.5, {"other": 101.0}), limits)


def test_the_actor_fails_a_reward_outside_its_declared_range():
    turn = [{"role": "assistant", "content": "7"}]
    specs = [{"fn": "exact_match", "range": (0.0, 0.5)}, {"fn": "think_format"}]
    score = score_sample(specs, [resolve(s["fn"]) for s in specs], turn, "7")
    assert score.failures["exact_match"].kind == "invalid" and score.total == 0.0
    assert BUILTIN_REWARD_RANGES.keys() == BUILTINS.keys()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_hostile_entries_are_dead_lettered_by_the_learner_which_keeps_stepping(
    redis_cfg, demo_policy, tmp_path
):
    steps = 2
    cfg = _config(
        redis_cfg,
        demo_policy,
        f"{redis_cfg.run.name}-hostile",
        tmp_path,
        run={"max_steps": steps},
        rollout={"max_prompt_tokens": 64},
    )
    valid = _stream_of(demo_policy, steps, seed=11)
    hostile = _hostile(valid[0], cfg.rollout.max_new_tokens)
    stream = []
    for i, group in enumerate(valid):
        stream.append(group)
        if i < len(hostile):
            bad, _ = list(hostile.values())[i]
            stream.append(_with(bad, group_id=f"hostile-{i}"))
    stream += [
        _with(bad, group_id=f"hostile-{i}")
        for i, (bad, _) in enumerate(hostile.values())
        if i >= len(valid)
    ]
    xadd_groups(cfg, stream)

    from streamrl.learner.grpo import GRPO

    GRPO(cfg).run(echo=lambda line: None)

    logged = _steps_logged(cfg)
    assert [row["step"] for row in logged] == list(range(1, steps + 1))
    assert all(row["staleness_mean"] >= 0 for row in logged)
    keys = Keys.from_config(cfg.run, cfg.broker)
    client = redis.Redis.from_url(cfg.broker.redis_url)
    try:
        dead = [fields for _, fields in client.xrange(keys.dead)]
        assert client.scard(keys.trained) == steps * GROUPS_PER_STEP
    finally:
        client.close()
    reasons = [f[b"reason"].decode() for f in dead]
    assert len(reasons) == len(hostile), reasons
    for (name, (_, words)), reason in zip(hostile.items(), reasons, strict=True):
        assert words in reason, f"{name}: {reason}"


def test_an_entry_delivered_max_deliveries_times_untrained_is_dead_lettered(redis_cfg):
    cfg = redis_cfg.model_copy(deep=True)
    cfg.rollout.group_size = 2
    cfg.broker.max_deliveries = 3
    keys = Keys.from_config(cfg.run, cfg.broker)
    payload = encode_group(make_group("poison"))
    sync = redis.Redis.from_url(cfg.broker.redis_url)
    sync.xadd(keys.stream, {"g": payload})

    async def incarnation() -> list[str]:
        """A learner that reads, then dies before it trains (no ack): its restart re-reads."""
        r = connect_async(cfg.broker, cfg.run.dir)
        got = await RolloutConsumer(
            r,
            keys,
            cfg.broker,
            limits_of(cfg),
            "learner-0",
            VOCAB,
        ).read(1, block_ms=50)
        await r.aclose()
        return [d.group.group_id for d in got]

    try:
        assert [asyncio.run(incarnation()) for _ in range(3)] == [["poison"], ["poison"], []]
        (_, fields), *_ = sync.xrange(keys.dead)
        assert b"delivered 3 times" in fields[b"reason"]
        assert sync.xlen(keys.stream) == 0
    finally:
        sync.close()


def test_dead_letters_keep_a_bounded_prefix_with_size_and_hash(redis_cfg):
    cfg = redis_cfg.model_copy(deep=True)
    cfg.broker.dead_letter_payload_bytes = 100
    keys = Keys.from_config(cfg.run, cfg.broker)
    garbage = bytes(range(256)) * 400
    sync = redis.Redis.from_url(cfg.broker.redis_url)
    sync.xadd(keys.stream, {"g": garbage})

    async def drain():
        r = connect_async(cfg.broker, cfg.run.dir)
        assert (
            await RolloutConsumer(
                r,
                keys,
                cfg.broker,
                limits_of(cfg),
                "learner-0",
                VOCAB,
            ).read(1, block_ms=50)
            == []
        )
        await r.aclose()

    try:
        asyncio.run(drain())
        (_, fields), *_ = sync.xrange(keys.dead)
        assert fields[b"g"] == garbage[:100]
        assert int(fields[b"size"]) == len(garbage)
        assert fields[b"sha256"].decode() == hashlib.sha256(garbage).hexdigest()
    finally:
        sync.close()


def test_a_version_key_that_is_no_version_does_not_stop_the_learner(redis_cfg):
    """The run's version key is the learner's, but any password holder can write it: a value that
    is not an integer is logged and ignored, the learner's own version checks the stream."""
    keys = Keys.from_config(redis_cfg.run, redis_cfg.broker)
    sync = redis.Redis.from_url(redis_cfg.broker.redis_url)
    sync.set(keys.version, b"\xffnot a version")

    async def start() -> int | None:
        r = connect_async(redis_cfg.broker, redis_cfg.run.dir)
        consumer = RolloutConsumer(r, keys, redis_cfg.broker, limits_of(redis_cfg), "l-0", VOCAB)
        await consumer.start_version_check(4)
        await r.aclose()
        return consumer.max_version

    try:
        assert asyncio.run(start()) == 4
    finally:
        sync.delete(keys.version)
        sync.close()
