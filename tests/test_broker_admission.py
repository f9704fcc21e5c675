"""Admission control: the staleness bound on produced-but-unconsumed work is never exceeded, and it
follows the version of the engine that will generate (a lagging actor gets a tighter bound)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from broker_helpers import VOCAB, limits_of, make_group

from streamrl.broker.admission import Admission, Bounds
from streamrl.broker.client import connect_async
from streamrl.broker.keys import Keys
from streamrl.broker.stream import RolloutConsumer, RolloutProducer

ROOT = Path(__file__).resolve().parents[1]


def _small(cfg, staleness: int = 1, groups_per_step: int = 3, ttl_s: float = 120.0):
    cfg.algo.max_staleness = staleness
    cfg.learner.groups_per_step = groups_per_step
    cfg.broker.lease_ttl_s = ttl_s
    # broker_helpers.make_group's groups
    cfg.rollout.group_size = 2
    return cfg


def _admission(r, cfg) -> Admission:
    return Admission(
        r,
        Keys.from_config(cfg.run, cfg.broker),
        Bounds.from_config(cfg.algo, cfg.learner),
        cfg.broker.lease_ttl_s,
    )


def test_try_start_grants_exactly_the_capacity_then_refuses(redis_cfg):
    # capacity (1 + 1) * 3 = 6
    cfg = _small(redis_cfg)

    async def main():
        r = connect_async(cfg.broker, cfg.run.dir)
        adm = _admission(r, cfg)
        leases = [await adm.try_start("a0", 0) for _ in range(8)]
        assert sum(lease is not None for lease in leases) == 6 and leases[6:] == [None, None]
        counts = await adm.counts()
        assert (counts["accepted"], counts["consumed"], counts["leases"]) == (0, 0, 6)
        # an abandoned group frees its slot
        await adm.release(leases[0])
        assert await adm.try_start("a0", 0) is not None
        assert await adm.try_start("a0", 0) is None
        await r.aclose()

    asyncio.run(main())


def test_publish_counts_the_group_once_and_only_a_completed_step_reopens_slots(redis_cfg):
    cfg = _small(redis_cfg, staleness=0, groups_per_step=2)

    async def main():
        r = connect_async(cfg.broker, cfg.run.dir)
        adm, producer = (
            _admission(r, cfg),
            RolloutProducer(r, Keys.from_config(cfg.run, cfg.broker), cfg.broker),
        )
        consumer = RolloutConsumer(
            r,
            Keys.from_config(cfg.run, cfg.broker),
            cfg.broker,
            limits_of(cfg),
            "rank0",
            VOCAB,
        )
        for i in range(2):
            await producer.publish(make_group(f"g{i}"), await adm.try_start("a0", 0))
        counts = await adm.counts()
        assert (counts["accepted"], counts["consumed"], counts["leases"]) == (2, 0, 0)
        assert await adm.try_start("a0", 0) is None
        # Reading a batch frees nothing: while it trains, a new group would be one version stale.
        got = await consumer.read(2, block_ms=100)
        assert len(got) == 2 and await adm.try_start("a0", 0) is None
        # The step completes: version 1 published, its 2 groups counted. Room for one more batch
        # on version 1, none for an engine still on version 0 (it would train at staleness 1).
        await adm.set_version(1)
        await adm.set_consumed(2)
        assert await adm.try_start("a0", 0) is None
        assert await adm.try_start("a0", 1) is not None
        assert await adm.try_start("a0", 1) is not None
        assert await adm.try_start("a0", 1) is None
        await r.aclose()

    asyncio.run(main())


def test_expired_leases_of_a_killed_actor_free_their_slots(redis_cfg):
    cfg = _small(redis_cfg, staleness=0, groups_per_step=2, ttl_s=0.2)

    async def main():
        r = connect_async(cfg.broker, cfg.run.dir)
        adm = _admission(r, cfg)
        killed, live = await adm.try_start("killed", 0), await adm.try_start("live", 0)
        assert killed and live and await adm.try_start("a1", 0) is None
        await asyncio.sleep(0.12)
        # a live actor keeps its long group's lease
        assert await adm.renew(live)
        await asyncio.sleep(0.12)
        # the killed actor's lease expired
        assert await adm.try_start("a1", 0) is not None
        # the renewed lease still holds its slot
        assert await adm.try_start("a1", 0) is None
        assert not await adm.renew(killed)
        await r.aclose()

    asyncio.run(main())


def test_version_is_shared_through_redis(redis_cfg):
    async def main():
        r = connect_async(redis_cfg.broker, redis_cfg.run.dir)
        adm = _admission(r, redis_cfg)
        assert await adm.version() == 0
        await adm.set_version(7)
        assert await _admission(r, redis_cfg).version() == 7
        await r.aclose()

    asyncio.run(main())


HAMMER = """
import asyncio, os, sys, time
sys.path.insert(0, "tests")
from broker_helpers import make_group
from streamrl.broker.admission import Admission, Bounds
from streamrl.broker.client import connect_async
from streamrl.broker.keys import Keys
from streamrl.broker.stream import RolloutProducer
from streamrl.configs import Config

cfg = Config.model_validate_json(os.environ["CFG"])

async def worker(adm, producer, name, stop_at):
    n = 0
    while time.monotonic() < stop_at:
        lease = await adm.try_start(name, 0)
        if lease is None:
            await asyncio.sleep(0.002)
            continue
        n += 1
        if n % 5 == 0:
            await adm.release(lease)  # a group given up
        else:
            await producer.publish(make_group(f"{name}-{n}"), lease)

async def main():
    r = connect_async(cfg.broker, cfg.run.dir)
    keys = Keys.from_config(cfg.run, cfg.broker)
    adm = Admission(r, keys, Bounds.from_config(cfg.algo, cfg.learner), cfg.broker.lease_ttl_s)
    producer = RolloutProducer(r, keys, cfg.broker)
    stop_at = time.monotonic() + float(sys.argv[2])
    await asyncio.gather(*(worker(adm, producer, f"{sys.argv[1]}.{t}", stop_at) for t in range(4)))
    await r.aclose()

asyncio.run(main())
"""


@pytest.mark.slow
def test_concurrent_producers_never_exceed_the_bound_while_the_consumer_lags(redis_cfg):
    # capacity 8
    cfg = _small(redis_cfg, staleness=1, groups_per_step=4)
    env = {**os.environ, "CFG": cfg.model_dump_json(), "PYTHONPATH": str(ROOT)}
    procs = [
        subprocess.Popen([sys.executable, "-c", HAMMER, f"p{i}", "1.5"], cwd=ROOT, env=env)
        for i in range(3)
    ]

    async def watch():
        r = connect_async(cfg.broker, cfg.run.dir)
        adm = _admission(r, cfg)
        consumer = RolloutConsumer(
            r,
            Keys.from_config(cfg.run, cfg.broker),
            cfg.broker,
            limits_of(cfg),
            "rank0",
            VOCAB,
        )
        samples, trained = [], 0
        deadline = time.monotonic() + 30
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            c = await adm.counts()
            samples.append(c)
            assert c["accepted"] + c["leases"] <= c["consumed"] + c["capacity"], c
            # a slow learner: one group now and then
            if len(samples) % 10 == 0:
                got = await consumer.read(1, block_ms=10)
                trained += len(got)
                ids = [d.entry_id for d in got]
                await consumer.ack(ids, [d.group.group_id for d in got], consumed=trained)
            await asyncio.sleep(0.005)
        stream_len = await r.xlen(consumer.keys.stream)
        await r.aclose()
        return samples, trained, stream_len

    samples, trained, stream_len = asyncio.run(watch())
    for p in procs:
        assert p.wait(10) == 0
    final = samples[-1]
    assert trained >= 1 and final["accepted"] >= trained
    # the backlog (and Redis memory) stays bounded
    assert stream_len <= final["capacity"]
    # and is used fully
    assert max(s["accepted"] + s["leases"] - s["consumed"] for s in samples) == final["capacity"]


def test_a_clean_stop_check_counts_live_leases_not_expired_ones_awaiting_pruning(redis_cfg):
    from streamrl.broker.cleanup import ephemeral_leftovers
    from streamrl.broker.client import connect_sync
    from streamrl.broker.keys import Keys

    cfg = _small(redis_cfg, ttl_s=0.2)

    async def lease(actor_id: str) -> str:
        r = connect_async(cfg.broker, cfg.run.dir)
        try:
            return await _admission(r, cfg).try_start(actor_id, 0)
        finally:
            await r.aclose()

    client, keys = connect_sync(cfg.broker, cfg.run.dir), Keys.from_config(cfg.run, cfg.broker)
    killed = asyncio.run(lease("killed"))
    assert ephemeral_leftovers(client, keys) == {"admission leases": [killed]}
    # expired; no try_start since, so it is still in the zset
    time.sleep(0.3)
    assert client.zcard(keys.leases) == 1
    assert ephemeral_leftovers(client, keys) == {}
    client.close()


def test_the_bound_follows_the_generating_engine_version_and_a_lagging_actors_lease(redis_cfg):
    """S = 1, B = 2, U = 1, learner at version 3 after 10 groups. An engine on version v may fill
    positions up to 10 + ((v + 1 - 3) + 1) * 2: version 3 -> 14, version 2 -> 12, version 1 -> 10.
    A live actor's lease on an old version holds everybody to its bound (a newer group could
    overtake it in the stream); a lease whose actor has no heartbeat only keeps its slot."""
    from streamrl.broker.liveness import Heartbeats

    cfg = _small(redis_cfg, staleness=1, groups_per_step=2)

    async def main():
        r = connect_async(cfg.broker, cfg.run.dir)
        adm, beats = (
            _admission(r, cfg),
            Heartbeats(r, Keys.from_config(cfg.run, cfg.broker), cfg.actor.heartbeat_s),
        )
        await r.set(adm.keys.accepted, 10)
        await adm.set_consumed(10)
        await adm.set_version(3)
        assert await adm.check("lagging", 1) == (None, 10, 10)
        lease, ahead, bound = await adm.check("lagging", 2)
        assert lease is not None and (ahead, bound) == (11, 12)
        # its actor has no heartbeat: the fresh actor gets its own bound
        fresh, ahead, bound = await adm.check("fresh", 3)
        assert fresh is not None and (ahead, bound) == (12, 14)
        await beats.beat("lagging", version=2)
        # now alive: nobody may start beyond the lagging engine's bound of 12 (12 are ahead)
        assert await adm.check("fresh", 3) == (None, 12, 12)
        # the lagging actor is killed and restarted under the same id (another process): its old
        # lease keeps its slot until it expires, but bounds nobody
        await beats.beat("lagging", version=3, pid=os.getpid() + 1)
        granted, ahead, bound = await adm.check("fresh", 3)
        assert granted is not None and (ahead, bound) == (13, 14)
        # the lagging group is published or given up: 12 ahead, bound 14
        await adm.release(lease)
        assert await adm.try_start("fresh", 3) is not None
        assert await adm.try_start("fresh", 3) is not None
        assert await adm.check("fresh", 3) == (None, 14, 14)
        await r.aclose()

    asyncio.run(main())


def test_updates_per_batch_counts_batches_not_versions(redis_cfg):
    """Two updates per batch: a batch moves the version by 2, so max_staleness 2 is one batch of
    look-ahead and max_staleness 1 none."""
    cfg = _small(redis_cfg, staleness=2, groups_per_step=2)
    cfg.learner.updates_per_batch = 2

    async def main():
        r = connect_async(cfg.broker, cfg.run.dir)
        adm = _admission(r, cfg)
        await adm.set_version(4)
        await adm.set_consumed(4)
        assert (await adm.check("a", 4))[2] == 8
        assert (await adm.check("a", 3))[2] == 6
        assert (await adm.check("a", 2))[2] == 6
        assert (await adm.check("a", 1))[2] == 4
        await r.aclose()

    asyncio.run(main())
