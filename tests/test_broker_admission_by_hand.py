"""Admission control on small cases worked out by hand, independent of the implementation.

Each expected number is counted on paper in the test's docstring: which learner steps an engine
version may still feed, how many groups those steps take, where a lease's expiry lands on Redis's
clock. None of them re-derives the module's formula; they enumerate what the formula stands for.
"""

from __future__ import annotations

import asyncio

import pytest

from streamrl.broker.admission import Admission, Bounds, lease_version, slots
from streamrl.broker.client import connect_async
from streamrl.broker.keys import Keys

# max_staleness 1, 3 groups per step, one version per step
BOUNDS = Bounds(max_staleness=1, versions_per_batch=1, groups_per_step=3)


def _admission(r, cfg, ttl_s: float = 120.0) -> Admission:
    return Admission(r, Keys.from_config(cfg.run, cfg.broker), BOUNDS, ttl_s)


@pytest.mark.parametrize(
    ("engine", "learner", "want"),
    [
        # learner on 0: steps start at 0, 1, 2, ...; an engine on 0 feeds those starting at <= 1
        # (0 and 1): 2 steps x 3 groups.
        (0, 0, 6),
        # learner on 1: the next steps start at 1, 2, ...; only the one at 1 is within 0 + 1.
        (0, 1, 3),
        # learner on 2: the next step starts at 2 > 0 + 1: the engine feeds no step at all.
        (0, 2, 0),
        (0, 3, 0),
        # an engine ahead of nobody: on 5 with the learner on 5, steps at 5 and 6 -> 6 groups.
        (5, 5, 6),
        # an engine on 4, learner on 2: steps at 2, 3, 4, 5 are all <= 4 + 1 -> 4 x 3 = 12.
        (4, 2, 12),
    ],
)
def test_slots_count_the_steps_an_engine_version_may_still_feed(engine, learner, want):
    """max_staleness 1, 3 groups per step, one version per step. A group generated on version v
    may be trained by any step that starts at version <= v + 1; the stream is FIFO, so the groups
    it may occupy are those of the learner's next steps that start no later than that."""
    assert slots(engine, learner, BOUNDS) == want


@pytest.mark.parametrize(
    ("engine", "want"),
    [
        # steps start at 4, 6, 8, ...: versions <= 4 + 2 = 6 -> steps 4 and 6 -> 2 x 2 groups.
        (4, 4),
        # <= 3 + 2 = 5 -> only the step at 4 -> 2 groups (not 1.5 steps' worth).
        (3, 2),
        # <= 2 + 2 = 4 -> the step at 4 -> 2 groups.
        (2, 2),
        # <= 1 + 2 = 3 -> none of 4, 6, ... -> 0.
        (1, 0),
    ],
)
def test_slots_when_a_batch_publishes_two_versions(engine, want):
    """Two updates per batch: the learner, now on version 4, starts its next steps at versions
    4, 6, 8, ... (each batch moves the version by 2). max_staleness 2, 2 groups per step."""
    bounds = Bounds(max_staleness=2, versions_per_batch=2, groups_per_step=2)
    assert slots(engine, 4, bounds) == want


@pytest.mark.parametrize(
    ("lease", "version"),
    [
        ("a0:41:9f3c@7", 7),
        # an actor id may itself contain '@': the version is what follows the last one
        ("team@host:41:9f3c@12", 12),
        ("a0:41:9f3c@0", 0),
    ],
)
def test_lease_version_reads_the_version_after_the_last_at_sign(lease, version):
    assert lease_version(lease) == version


def test_a_lease_names_its_actor_and_engine_version(redis_cfg):
    """A lease id is ``{actor}:{pid}:{hex}@{version}``: the script matches the heartbeat of
    ``actor`` and bounds everybody by ``version``, so both must be the caller's."""
    cfg = redis_cfg

    async def main():
        r = connect_async(cfg.broker, cfg.run.dir)
        lease = await _admission(r, cfg).try_start("actor-7", 3)
        await r.aclose()
        return lease

    lease = asyncio.run(main())
    assert lease.startswith("actor-7:") and lease_version(lease) == 3


def test_counts_report_each_counter_and_the_capacity(redis_cfg):
    """max_staleness 1, 3 groups per step: an engine on the learner's version feeds the steps
    starting at that version and the next one, 2 x 3 = 6 (the capacity). A fresh run reads all
    zeros; after 5 accepted, 2 consumed, 1 discarded, 4 trimmed, version 3 and one lease, each
    counter reads back as written."""
    cfg = redis_cfg

    async def main():
        r = connect_async(cfg.broker, cfg.run.dir)
        adm = _admission(r, cfg)
        fresh = await adm.counts()
        k = adm.keys
        for key, value in ((k.accepted, 5), (k.discarded, 1), (k.trimmed, 4)):
            await r.set(key, value)
        await adm.set_consumed(2, version=3)
        # accepted 5 + 0 leases < 2 + 1 + 4 + 6 = 13: the lease is granted
        assert await adm.try_start("a0", 3) is not None
        after = await adm.counts()
        await r.aclose()
        return fresh, after

    fresh, after = asyncio.run(main())
    zeros = dict.fromkeys(("accepted", "consumed", "discarded", "trimmed", "leases", "version"), 0)
    assert fresh == {**zeros, "capacity": 6}
    assert after == {
        "accepted": 5,
        "consumed": 2,
        "discarded": 1,
        "trimmed": 4,
        "leases": 1,
        "version": 3,
        "capacity": 6,
    }


def test_set_consumed_never_lowers_and_reset_does(redis_cfg):
    """The running total only grows through set_consumed: 4, then 9, then a stale 6 leaves 9
    (and says so). The version rides along only when given. reset_consumed (Redis lost the count)
    overwrites it, down to 3."""
    cfg = redis_cfg

    async def main():
        r = connect_async(cfg.broker, cfg.run.dir)
        adm = _admission(r, cfg)
        seen = [await adm.set_consumed(4, version=2)]
        seen.append(await adm.version())
        seen.append(await adm.set_consumed(9))
        seen.append(await adm.version())
        seen.append(await adm.set_consumed(6, version=5))
        seen.append((await adm.counts())["consumed"])
        await adm.reset_consumed(3)
        seen.append((await adm.counts())["consumed"])
        await r.aclose()
        return seen

    # set 4 (v2) -> 4; version 2; set 9 -> 9; version still 2; stale 6 (v5) -> 9; 9; reset -> 3
    assert asyncio.run(main()) == [4, 2, 9, 2, 9, 9, 3]


def test_a_lease_expires_one_ttl_after_it_is_taken_on_redis_clock(redis_cfg):
    """TTL 100 s: the lease's expiry (its score) is Redis's clock at the grant plus 100 000 ms,
    and a renewal moves it to the clock at the renewal plus 100 000 ms. Both calls take a few
    milliseconds, far less than the 50 ms tolerance, and far less than the 100 ms a TTL read as
    100.1 s would add."""
    cfg = redis_cfg

    async def main():
        r = connect_async(cfg.broker, cfg.run.dir)
        adm = _admission(r, cfg, ttl_s=100.0)

        async def now_ms() -> int:
            sec, usec = await r.time()
            return sec * 1000 + usec // 1000

        before = await now_ms()
        lease = await adm.try_start("a0", 0)
        granted = await r.zscore(adm.keys.leases, lease) - before
        await asyncio.sleep(0.2)
        before = await now_ms()
        assert await adm.renew(lease)
        renewed = await r.zscore(adm.keys.leases, lease) - before
        await r.aclose()
        return granted, renewed

    granted, renewed = asyncio.run(main())
    assert 100_000 - 50 <= granted <= 100_000 + 50
    assert 100_000 - 50 <= renewed <= 100_000 + 50


def test_counts_read_all_counters_in_one_transaction(redis_cfg):
    """The counters are read as one snapshot (MULTI ... EXEC): read one by one, a step completing
    between the ``consumed`` and the ``leases`` reads would show more groups ahead than the bound
    allows. Redis counts each EXEC it runs: one counts() call runs exactly one."""
    cfg = redis_cfg

    async def main():
        r = connect_async(cfg.broker, cfg.run.dir)

        async def execs() -> int:
            return (await r.info("commandstats")).get("cmdstat_exec", {}).get("calls", 0)

        before = await execs()
        await _admission(r, cfg).counts()
        after = await execs()
        await r.aclose()
        return after - before

    assert asyncio.run(main()) == 1
