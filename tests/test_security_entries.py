"""Hostile but well-typed stream entries (issue 26, holes 3 and 8): a reward part that takes the
mean reward's name or an absurd magnitude, behaviour log-probs no sampler produces, and bloat
(huge ids, thousands of part names, a NaN time). Each is refused with its reason by the decoder
or the limits, and through the real consumer goes to the dead-letter stream while valid groups
keep flowing; the run's target reads the real mean reward only."""

from __future__ import annotations

import asyncio
import dataclasses
import math

import msgpack
import numpy as np
import pytest
import redis
from broker_helpers import VOCAB, limits_of, make_group

from streamrl.broker.client import connect_async
from streamrl.broker.keys import Keys
from streamrl.broker.semantics import Limits, check_group
from streamrl.broker.stream import RolloutConsumer
from streamrl.broker.wire import (
    MAX_ID_CHARS,
    MAX_REWARD_PARTS,
    MIN_LOGPROB,
    WireError,
    decode_group,
    encode_group,
)
from streamrl.learner import target

LIMITS = Limits(group_size=2, max_completion_tokens=8, max_prompt_tokens=16, max_abs_reward=1e6)
MIB = "x" * (1 << 20)


def _parts(group, parts: dict):
    return dataclasses.replace(
        group, completions=[dataclasses.replace(c, reward_parts=parts) for c in group.completions]
    )


def _logprob(group, value: float, ref: bool = False):
    first = group.completions[0]
    lp = first.logprobs.copy()
    lp[-1] = value
    changed = (
        dataclasses.replace(first, ref_logprobs=lp)
        if ref
        else dataclasses.replace(first, logprobs=lp)
    )
    rest = group.completions[1:]
    if ref:
        rest = [dataclasses.replace(c, ref_logprobs=c.logprobs.copy()) for c in rest]
    return dataclasses.replace(group, completions=[changed, *rest])


def _hostile(group) -> dict[str, tuple[bytes, str]]:
    """Encoded variants of a valid group, each with the words its reason must carry."""
    nan_time = msgpack.unpackb(encode_group(group), raw=False)
    nan_time["t"] = math.nan
    cases = {
        "part_named_reward": (_parts(group, {"reward": 1e300}), "reserved"),
        "part_of_absurd_magnitude": (_parts(group, {"format": 1e300}), "broker.max_abs_reward"),
        "four_thousand_part_names": (
            _parts(group, {f"p{i}": 0.0 for i in range(4000)}),
            f"at most {MAX_REWARD_PARTS}",
        ),
        "huge_part_name": (_parts(group, {"p" * 100_000: 1.0}), "reward-part name"),
        "logprob_minus_1e4": (_logprob(group, -1e4), "no sampler produces"),
        "logprob_minus_3e38": (_logprob(group, -3e38), "no sampler produces"),
        "ref_logprob_minus_3e38": (_logprob(group, -3e38, ref=True), "rlp"),
        "mib_group_id": (dataclasses.replace(group, group_id=MIB), "group.gid"),
        "mib_actor_id": (dataclasses.replace(group, actor_id=MIB), "group.aid"),
        "mib_meta": (dataclasses.replace(group, meta={"note": MIB}), "group.meta"),
    }
    encoded = {name: (encode_group(g), words) for name, (g, words) in cases.items()}
    encoded["nan_created_at"] = (msgpack.packb(nan_time, use_bin_type=True), "group.t")
    return encoded


def _refused(payload: bytes) -> str:
    with pytest.raises(WireError) as caught:
        check_group(decode_group(payload, VOCAB), LIMITS)
    return str(caught.value)


@pytest.mark.parametrize("case", sorted(_hostile(make_group("g"))))
def test_each_hostile_entry_is_refused_with_its_reason(case):
    payload, words = _hostile(make_group("g"))[case]
    assert words in _refused(payload)


def test_the_bounds_leave_real_entries_alone():
    group = _parts(make_group("g"), {"format": 1.0, "exact": 0.0})
    group = _logprob(dataclasses.replace(group, group_id="g" * MAX_ID_CHARS), MIN_LOGPROB)
    check_group(decode_group(encode_group(group), VOCAB), LIMITS)
    # the bound on behaviour log-probs is where a float32 sampler's probabilities end
    assert math.exp(MIN_LOGPROB) == pytest.approx(float(np.finfo(np.float32).tiny), rel=1e-6)
    below = np.nextafter(np.float32(MIN_LOGPROB), np.float32(-np.inf))
    assert "no sampler produces" in _refused(encode_group(_logprob(group, float(below))))


def test_a_part_named_reward_cannot_stand_in_for_the_mean_reward():
    row = {"reward_mean": 0.1, "reward_parts": {"reward": 1e300, "exact": 0.2}}
    assert target.measures(row, {}) == {"reward": 0.1, "exact": 0.2}
    rows = [target.measures(row, {})] * 3
    assert not target.window_reached(rows, {"reward": 0.5}, window=3)


def test_the_consumer_dead_letters_each_with_its_reason_and_delivers_the_valid(redis_cfg):
    cfg = redis_cfg.model_copy(deep=True)
    cfg.rollout.group_size = 2
    keys = Keys.from_config(cfg.run, cfg.broker)
    hostile = _hostile(make_group("hostile"))
    sync = redis.Redis.from_url(cfg.broker.redis_url)
    for payload, _ in hostile.values():
        sync.xadd(keys.stream, {"g": payload})
    sync.xadd(keys.stream, {"g": encode_group(make_group("valid"))})

    async def drain() -> list[str]:
        r = connect_async(cfg.broker, cfg.run.dir)
        consumer = RolloutConsumer(
            r,
            keys,
            cfg.broker,
            limits_of(cfg),
            "learner-0",
            VOCAB,
        )
        got = await consumer.read(len(hostile) + 1, block_ms=50)
        await r.aclose()
        return [d.group.group_id for d in got]

    try:
        assert asyncio.run(drain()) == ["valid"]
        reasons = [f[b"reason"].decode() for _, f in sync.xrange(keys.dead)]
        assert len(reasons) == len(hostile)
        for (name, (_, words)), reason in zip(hostile.items(), reasons, strict=True):
            assert words in reason, f"{name}: {reason}"
        # nothing of the bloat reached the set kept for the run's life
        assert sync.smembers(keys.trained) == set()
    finally:
        sync.close()


def test_a_forged_entry_reusing_a_group_id_cannot_suppress_the_real_group(redis_cfg):
    """Hole 9: a group written first under another actor's group id, trained or still in flight,
    used to make the real group drop as a duplicate. Groups are told apart by content: the real
    one is trained under a qualified id, and its own redelivery is still a duplicate."""
    cfg = redis_cfg.model_copy(deep=True)
    cfg.rollout.group_size = 2
    keys = Keys.from_config(cfg.run, cfg.broker)
    real = make_group("actor-1-7-0badcafe")
    forged = dataclasses.replace(make_group("forged"), group_id=real.group_id)
    sync = redis.Redis.from_url(cfg.broker.redis_url)

    async def main() -> list[list[str]]:
        r = connect_async(cfg.broker, cfg.run.dir)
        consumer = RolloutConsumer(
            r,
            keys,
            cfg.broker,
            limits_of(cfg),
            "learner-0",
            VOCAB,
        )
        seen = []

        async def read_and_ack() -> None:
            got = await consumer.read(10, block_ms=50)
            seen.append([d.group.group_id for d in got])
            await consumer.ack([d.entry_id for d in got], [d.group.group_id for d in got])

        # trained before the real one arrives
        sync.xadd(keys.stream, {"g": encode_group(forged)})
        await read_and_ack()
        sync.xadd(keys.stream, {"g": encode_group(real)})
        await read_and_ack()
        # the real group again (a retried XADD): a duplicate
        sync.xadd(keys.stream, {"g": encode_group(real)})
        await read_and_ack()
        # both in flight at once, under a second id
        other = make_group("actor-1-8-0ddba11")
        sync.xadd(keys.stream, {"g": encode_group(_parts(other, {"forged": 1.0}))})
        sync.xadd(keys.stream, {"g": encode_group(other)})
        await read_and_ack()
        await r.aclose()
        return seen

    try:
        seen = asyncio.run(main())
    finally:
        sync.close()
    gid = real.group_id
    assert seen[0] == [gid]
    assert len(seen[1]) == 1 and seen[1][0].startswith(f"{gid}~")
    assert seen[2] == []
    assert seen[3][0] == "actor-1-8-0ddba11" and seen[3][1].startswith("actor-1-8-0ddba11~")
