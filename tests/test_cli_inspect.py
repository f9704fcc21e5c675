"""``streamrl inspect`` decodes what a run's Redis holds; the console script dispatches to each command."""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from pathlib import Path

import numpy as np
import redis
import redis.asyncio
import torch
from broker_helpers import limits_of
from opened_paths import opened_paths

from streamrl.broker.keys import Keys
from streamrl.broker.wire import Completion, RolloutGroup, encode_group
from streamrl.weightsync.publisher import Publisher


def _group(group_id: str) -> RolloutGroup:
    completions = [
        Completion(
            token_ids=np.array([5, 6, 2], dtype=np.int32),
            logprobs=np.array([-0.5, -0.5, -0.1], dtype=np.float32),
            versions=np.array([3, 3, 4], dtype=np.int32),
            reward=reward,
        )
        for reward in (0.0, 1.0)
    ]
    return RolloutGroup(group_id, "row1", "actor-a", 0, np.array([1, 2], np.int32), completions)


def test_inspect_prints_decoded_entries_pending_dead_letters_with_reasons_and_counters(
    redis_cfg, capsys
):
    from streamrl.broker.client import connect_async
    from streamrl.broker.stream import RolloutConsumer
    from streamrl.launch.cli import main

    keys = Keys.from_config(redis_cfg.run, redis_cfg.broker)
    client = redis.Redis.from_url(redis_cfg.broker.redis_url)
    client.xadd(keys.stream, {"g": encode_group(_group("g-1"))})
    client.xadd(keys.stream, {"g": b"\x93not msgpack of a group"})
    client.set(keys.accepted, 2)
    client.set(keys.version, 4)
    # groups of two completions pass the consumer's group-size check (broker.semantics)
    cfg = redis_cfg.model_copy(
        deep=True, update={"rollout": redis_cfg.rollout.model_copy(update={"group_size": 2})}
    )

    async def read():
        r = connect_async(cfg.broker, cfg.run.dir)
        try:
            return await RolloutConsumer(
                r,
                keys,
                cfg.broker,
                limits_of(cfg),
                "learner-0",
            ).read(2, 100)
        finally:
            await r.aclose()

    assert [d.group.group_id for d in asyncio.run(read())] == ["g-1"]
    client.xadd(keys.stream, {"g": encode_group(_group("g-2"))})

    overrides = [f"run.name={redis_cfg.run.name}", f"broker.redis_url={redis_cfg.broker.redis_url}"]
    assert main(["inspect", "--json", *overrides]) == 0
    assert json.loads(capsys.readouterr().out)["weights"] is None
    shm_cfg = redis_cfg.model_copy(
        update={"weightsync": redis_cfg.weightsync.model_copy(update={"transport": "shm"})}
    )
    publisher = Publisher.from_config(shm_cfg.weightsync, shm_cfg.broker, shm_cfg.run)
    try:
        publisher.publish(4, {"w": torch.ones(8)})
        assert main(["inspect", "--json", *overrides]) == 0
        report = json.loads(capsys.readouterr().out)
    finally:
        publisher.close()
    weights = report["weights"]
    assert (weights["version"], weights["transport"], weights["readers_copying"]) == (4, "shm", [])
    assert report["admission"]["version"] == 4 and report["admission"]["accepted"] == 2
    assert report["stream"]["length"] == 2
    assert [e["group_id"] for e in report["stream"]["last"]] == ["g-2", "g-1"]
    newest = report["stream"]["last"][0]
    assert newest["actor"] == "actor-a" and newest["reward_mean"] == 0.5
    assert newest["versions"] == [3, 4] and newest["completions"] == 2
    assert [(p["consumer"], p["deliveries"]) for p in report["pending"]] == [("learner-0", 1)]
    assert report["dead_letter"]["length"] == 1
    dead = report["dead_letter"]["last"][0]
    assert dead["reason"] and "error" in dead

    assert main(["inspect", *overrides]) == 0
    text = capsys.readouterr().out
    assert "policy version 4" in text and '"group_id": "g-2"' in text and dead["reason"] in text
    assert "weights: " in text


def test_inspect_shows_names_from_redis_that_are_not_a_segment_or_a_host_refused_and_opens_none(
    redis_cfg, tmp_path, capsys
):
    """A peer holding the Redis password announces a "segment" ``../../<victim>`` and beats as
    host ``../../<folder>``; the run directory's ``placement.json`` is a link to a file of the
    user's. inspect shows each refused, with the reason, and opens, reads and prints none."""
    from streamrl.broker.liveness import Heartbeats
    from streamrl.launch.cli import main
    from streamrl.weightsync.announce import announce

    secret = f"SECRET-{uuid.uuid4().hex}"
    victim = tmp_path / f"victim-{uuid.uuid4().hex}"
    victim.write_text(f"{secret}\n" + "x" * 8192)
    # a placement.json (of a host folder) the victim user keeps elsewhere: never read by the name
    elsewhere = tmp_path / f"elsewhere-{uuid.uuid4().hex}"
    elsewhere.mkdir()
    (elsewhere / "placement.json").write_text(json.dumps({"learner": secret}))
    run_dir = Path(redis_cfg.run.dir)
    run_dir.mkdir()
    (run_dir / "placement.json").symlink_to(elsewhere / "placement.json")
    keys = Keys.from_config(redis_cfg.run, redis_cfg.broker)
    client = redis.Redis.from_url(redis_cfg.broker.redis_url)
    announce(client, keys, 3, "shm", "hostile", {"segment": "../.." + str(victim), "slot": 0})
    host = os.path.relpath(elsewhere, run_dir / "hosts")

    async def beat() -> None:
        r = redis.asyncio.Redis.from_url(redis_cfg.broker.redis_url)
        await Heartbeats(r, keys, heartbeat_s=30.0).beat("a0", version=3, host=host)
        await r.aclose()

    asyncio.run(beat())
    overrides = [
        f"run.name={redis_cfg.run.name}",
        f"run.dir={run_dir}",
        f"broker.redis_url={redis_cfg.broker.redis_url}",
    ]
    with opened_paths() as opened:
        assert main(["inspect", "--json", *overrides]) == 0
        report = json.loads(capsys.readouterr().out)
        assert main(["inspect", *overrides]) == 0
        text = capsys.readouterr().out
    assert not [p for p in opened if victim.name in p or elsewhere.name in p], opened
    weights = report["weights"]
    assert weights["readers_copying"] is None
    assert "refused segment name" in weights["segment_refused"]
    assert "is not a host name" in report["hosts"][host]["placement"]
    assert "a link on the way" in report["placement"]
    assert secret not in json.dumps(report) and secret not in text
    assert "refused segment name" in text and "placement not read" in text
