"""``algo.max_staleness: auto`` between learner and actors: the bound the learner publishes after a
step is the one the actors' admission enforces at their next request (no restart), only within
the actors' own configured ``[min, max]`` whatever is written in its key, and a fixed bound never
reads that key."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from broker_helpers import VOCAB

from streamrl.broker.admission import Admission, Bounds
from streamrl.broker.client import connect_async
from streamrl.broker.keys import Keys
from streamrl.learner import staleness_control
from streamrl.learner.grpo import GRPO, rollout_io

GROUPS_PER_STEP = 2


def _config(cfg, staleness):
    cfg.learner.groups_per_step = GROUPS_PER_STEP
    cfg.algo.max_staleness = staleness
    if staleness == "auto":
        cfg.algo.staleness_auto.min, cfg.algo.staleness_auto.max = 1, 4
    return cfg


@pytest.fixture
def auto(redis_cfg):
    """A run under ``max_staleness: auto`` in [1, 4], and its rank 0's RolloutIO."""
    cfg = _config(redis_cfg, "auto")
    io = rollout_io(cfg, VOCAB)
    yield cfg, io
    io.close()


async def count(adm: Admission) -> int:
    """Leases an actor on the learner's version (0) is granted in a row (released after)."""
    leases = []
    while (lease := await adm.try_start("a0", 0)) is not None:
        leases.append(lease)
    for lease in leases:
        await adm.release(lease)
    return len(leases)


def actor_side(cfg, r) -> Admission:
    """The admission an actor of ``cfg`` makes once, at its start."""
    keys = Keys.from_config(cfg.run, cfg.broker)
    return Admission(r, keys, Bounds.from_config(cfg.algo, cfg.learner), 60.0)


def grants(cfg, write: str | None = None) -> int:
    """``count`` for a new actor of ``cfg``; ``write``: a raw value put in the bound's key first."""

    async def main():
        r = connect_async(cfg.broker, cfg.run.dir)
        adm = actor_side(cfg, r)
        if write is not None:
            await r.set(adm.keys.bound, write)
        granted = await count(adm)
        await r.aclose()
        return granted

    return asyncio.run(main())


def slots_at(bound: int) -> int:
    """What admission grants an engine on the learner's version: the steps starting at versions
    up to ``bound`` ahead, ``groups_per_step`` each."""
    return (bound + 1) * GROUPS_PER_STEP


def test_each_bound_the_learner_publishes_is_enforced_at_the_actors_next_request(auto):
    """One actor-side admission, made before the learner publishes anything, follows every
    bound the learner's RolloutIO publishes."""
    cfg, io = auto

    async def main():
        r = connect_async(cfg.broker, cfg.run.dir)
        adm = actor_side(cfg, r)
        counted = [await count(adm)]
        for bound in (3, 2, 4, 1):
            io.set_bound(bound)
            counted.append(await count(adm))
        await r.aclose()
        return counted

    assert asyncio.run(main()) == [slots_at(b) for b in (1, 3, 2, 4, 1)]


def test_the_bound_a_step_row_reports_is_the_one_admission_enforces_next(auto):
    """The learner's own path (``GRPO._steer_staleness``: the controller's decision, published)
    over steps whose ESS leaves room, then falls under the floor (one step per decision)."""
    cfg, io = auto
    cfg.algo.staleness_auto.window = 1
    target = staleness_control.DriftTarget.from_config(cfg.algo, cfg.learner)
    learner = SimpleNamespace(
        io=io, staleness_target=target, staleness=staleness_control.start(target)
    )

    async def main():
        r = connect_async(cfg.broker, cfg.run.dir)
        adm = actor_side(cfg, r)
        rows = []
        for ess in [0.99] * 12 + [0.5] * 10:
            rows.append(GRPO._steer_staleness(learner, ess))
            assert await count(adm) == slots_at(rows[-1]["max_staleness"])
        await r.aclose()
        return rows

    rows = asyncio.run(main())
    assert {row["max_staleness"] for row in rows} == {1, 2, 3, 4}
    assert rows[-1]["max_staleness"] == 1 and rows[-1]["staleness_reason"]


@pytest.mark.parametrize(
    ("written", "enforced"),
    [
        # over the actor's max: its max
        ("99", 4),
        ("inf", 4),
        # under its min, or no number at all: its min
        ("-3", 1),
        ("0", 1),
        ("nan", 1),
        ("two", 1),
        ("", 1),
        # a fraction rounds down (still within the range)
        ("3.7", 3),
    ],
)
def test_whatever_is_written_in_the_bounds_key_admission_keeps_within_the_actors_range(
    auto, written, enforced
):
    cfg, _ = auto
    assert grants(cfg, write=written) == slots_at(enforced)


def test_a_fixed_bound_never_reads_the_published_one(redis_cfg):
    cfg = _config(redis_cfg, 2)
    assert grants(cfg, write="4") == grants(cfg, write="0") == slots_at(2)
