"""The rollout stream: at-least-once delivery, de-duplicated by group id, nothing lost, bad data dead-lettered."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis
from broker_helpers import VOCAB, limits_of, make_group

from streamrl.broker import metrics
from streamrl.broker.client import connect_async, connect_sync
from streamrl.broker.keys import Keys
from streamrl.broker.server import EmbeddedRedis
from streamrl.broker.stream import RolloutConsumer, RolloutProducer
from streamrl.broker.wire import encode_group
from streamrl.configs import Config

# broker_helpers.make_group's groups: 2 completions; the consumer checks rollout.group_size.
GROUP = {"rollout": {"group_size": 2}}


@pytest.fixture
def redis_cfg(redis_cfg):
    return redis_cfg.model_copy(
        update={"rollout": redis_cfg.rollout.model_copy(update=GROUP["rollout"])}
    )


ROOT = Path(__file__).resolve().parents[1]


def run(coro):
    return asyncio.run(coro)


async def _publish(cfg, ids):
    r = connect_async(cfg.broker, cfg.run.dir)
    producer = RolloutProducer(r, Keys.from_config(cfg.run, cfg.broker), cfg.broker)
    out = [await producer.publish(make_group(i)) for i in ids]
    await r.aclose()
    return out


def _consumer(r, cfg, name: str) -> RolloutConsumer:
    return RolloutConsumer(
        r,
        Keys.from_config(cfg.run, cfg.broker),
        cfg.broker,
        limits_of(cfg),
        name,
        VOCAB,
    )


def _counter(metric) -> float:
    return metric._value.get()


def test_published_groups_are_delivered_in_order_and_acked_entries_leave_the_stream(redis_cfg):
    cfg = redis_cfg
    keys = Keys.from_config(cfg.run, cfg.broker)
    sync = connect_sync(cfg.broker, cfg.run.dir)

    async def main():
        await _publish(cfg, [f"g{i}" for i in range(5)])
        r = connect_async(cfg.broker, cfg.run.dir)
        consumer = _consumer(r, cfg, "rank0")
        got = await consumer.read(10, block_ms=100)
        assert [d.group.group_id for d in got] == [f"g{i}" for i in range(5)]
        assert not any(d.redelivered for d in got)
        assert sync.xlen(keys.stream) == 5
        # reading counts nothing: completed steps do
        assert sync.get(keys.consumed) is None
        await consumer.ack([d.entry_id for d in got], [d.group.group_id for d in got], consumed=5)
        assert await consumer.read(10, block_ms=50) == []
        # a replayed, older total never lowers the count
        await consumer.ack([], [], consumed=3)
        await r.aclose()

    run(main())
    assert sync.xlen(keys.stream) == 0
    assert sync.xpending(keys.stream, cfg.broker.consumer_group)["pending"] == 0
    assert sync.smembers(keys.trained) == {f"g{i}".encode() for i in range(5)}
    assert int(sync.get(keys.accepted)) == 5 and int(sync.get(keys.consumed)) == 5


def test_unacked_entries_are_redelivered_first_to_a_restarted_consumer_and_counted_once(redis_cfg):
    cfg = redis_cfg
    keys = Keys.from_config(cfg.run, cfg.broker)

    async def main():
        await _publish(cfg, ["a", "b", "c", "d"])
        r = connect_async(cfg.broker, cfg.run.dir)
        first = await _consumer(r, cfg, "rank0").read(3, block_ms=100)
        assert [d.group.group_id for d in first] == ["a", "b", "c"]
        # same name, state lost with the process
        restarted = _consumer(r, cfg, "rank0")
        again = await restarted.read(10, block_ms=100)
        assert [(d.group.group_id, d.redelivered) for d in again] == [
            ("a", True),
            ("b", True),
            ("c", True),
            ("d", False),
        ]
        await restarted.ack([d.entry_id for d in again], [d.group.group_id for d in again])
        assert await r.get(keys.consumed) is None and await r.get(keys.discarded) is None
        await r.aclose()

    run(main())


def test_duplicate_entries_of_a_group_are_acked_and_skipped(redis_cfg):
    cfg = redis_cfg
    keys = Keys.from_config(cfg.run, cfg.broker)
    before = _counter(metrics.STREAM_DUPLICATES)

    async def main():
        # a retried XADD duplicates an entry
        await _publish(cfg, ["x", "x", "y"])
        r = connect_async(cfg.broker, cfg.run.dir)
        consumer = _consumer(r, cfg, "rank0")
        got = await consumer.read(10, block_ms=100)
        assert [d.group.group_id for d in got] == ["x", "y"]
        # duplicate while "y" is delivered but not yet acked
        await _publish(cfg, ["y"])
        assert await consumer.read(10, block_ms=50) == []
        await consumer.ack([d.entry_id for d in got], [d.group.group_id for d in got])
        # duplicate of an already trained group
        await _publish(cfg, ["x"])
        assert await consumer.read(10, block_ms=50) == []
        assert await r.xlen(keys.stream) == 0
        assert (await r.xpending(keys.stream, cfg.broker.consumer_group))["pending"] == 0
        # the three duplicates are counted for admission, once each, by the script that acked them
        assert int(await r.get(keys.discarded)) == 3
        await r.aclose()

    run(main())
    assert _counter(metrics.STREAM_DUPLICATES) - before == 3


def test_undecodable_entries_go_to_the_dead_letter_stream_with_their_reason(redis_cfg):
    cfg = redis_cfg
    keys = Keys.from_config(cfg.run, cfg.broker)
    sync = connect_sync(cfg.broker, cfg.run.dir)
    out_of_vocab = make_group("bad-vocab")
    out_of_vocab.completions[0].token_ids[0] = VOCAB + 7
    garbage_id = sync.xadd(keys.stream, {"g": b"\xc1 not msgpack"}).decode()
    vocab_id = sync.xadd(keys.stream, {"g": encode_group(out_of_vocab)}).decode()
    nofield_id = sync.xadd(keys.stream, {"other": b"1"}).decode()
    before = _counter(metrics.STREAM_DEAD_LETTER)

    async def main():
        await _publish(cfg, ["good"])
        r = connect_async(cfg.broker, cfg.run.dir)
        got = await _consumer(r, cfg, "rank0").read(10, block_ms=100)
        await r.aclose()
        return got

    got = run(main())
    assert [d.group.group_id for d in got] == ["good"]
    dead = {f[b"source_id"].decode(): f for _, f in sync.xrange(keys.dead)}
    assert set(dead) == {garbage_id, vocab_id, nofield_id}
    assert b"not valid msgpack" in dead[garbage_id][b"reason"]
    assert b"token id outside the vocabulary" in dead[vocab_id][b"reason"]
    assert dead[vocab_id][b"g"] == encode_group(out_of_vocab)
    assert b"no 'g' field" in dead[nofield_id][b"reason"]
    # only "good" awaits its ack
    assert sync.xpending(keys.stream, cfg.broker.consumer_group)["pending"] == 1
    assert _counter(metrics.STREAM_DEAD_LETTER) - before == 3


def test_held_entries_are_not_claimed_by_a_peer_but_idle_ones_are(redis_cfg):
    cfg = redis_cfg
    cfg.broker.claim_idle_ms = 300

    async def main():
        await _publish(cfg, ["h1", "h2", "i1"])
        r = connect_async(cfg.broker, cfg.run.dir)
        holder = _consumer(r, cfg, "rank0")
        held = await holder.read(2, block_ms=100)
        idle = await _consumer(r, cfg, "rank-dead").read(1, block_ms=100)
        assert [d.group.group_id for d in held + idle] == ["h1", "h2", "i1"]
        peer = _consumer(r, cfg, "rank1")
        deadline = time.monotonic() + 0.8
        claimed = []
        # the holder keeps reading (one slow step after another)
        while time.monotonic() < deadline:
            claimed += await holder.read(1, block_ms=20)
            claimed += await peer.read(5, block_ms=20)
        # The dead consumer's entry is claimed (by whichever live one looked first), the held ones never.
        assert [(d.group.group_id, d.redelivered) for d in claimed] == [("i1", True)]
        await r.aclose()

    run(main())


def test_maxlen_trims_are_counted_and_release_their_admission_slots(redis_cfg):
    cfg = redis_cfg
    cfg.broker.maxlen = 10
    keys = Keys.from_config(cfg.run, cfg.broker)
    before = _counter(metrics.STREAM_TRIMMED)
    run(_publish(cfg, [f"t{i}" for i in range(250)]))
    sync = connect_sync(cfg.broker, cfg.run.dir)
    trimmed = _counter(metrics.STREAM_TRIMMED) - before
    assert trimmed > 0 and sync.xlen(keys.stream) == 250 - trimmed
    assert int(sync.get(keys.trimmed)) == trimmed


def test_a_trim_counts_only_unread_entries_the_learner_counts_those_it_read(redis_cfg):
    # An entry read and then trimmed is still held (and counted with its step) by the learner;
    # counting it for the trim too would count it twice.
    cfg = redis_cfg
    cfg.broker.maxlen = 4
    keys = Keys.from_config(cfg.run, cfg.broker)

    async def main():
        await _publish(cfg, ["r0", "r1", "r2", "r3"])
        r = connect_async(cfg.broker, cfg.run.dir)
        got = await _consumer(r, cfg, "rank0").read(2, block_ms=100)
        assert [d.group.group_id for d in got] == ["r0", "r1"]
        # trims r0, r1 (read) and r2 (unread)
        await _publish(cfg, ["n0", "n1", "n2"])
        assert await r.xlen(keys.stream) == 4
        assert int(await r.get(keys.trimmed)) == 1
        await r.aclose()

    run(main())


def test_discarding_an_entry_twice_dead_letters_and_counts_it_once(redis_cfg):
    # a retried discard (lost reply) or a restarted learner re-reading it must not count it again
    cfg = redis_cfg
    keys = Keys.from_config(cfg.run, cfg.broker)

    async def main():
        r = connect_async(cfg.broker, cfg.run.dir)
        entry = await r.xadd(keys.stream, {"g": b"not msgpack"})
        consumer = _consumer(r, cfg, "rank0")
        await consumer.ensure_group()
        await r.xreadgroup(cfg.broker.consumer_group, "rank0", {keys.stream: ">"})
        dead = [(entry.decode(), b"not msgpack", "bad")]
        await consumer._dead_letter_and_drop(dead, [])
        await consumer._dead_letter_and_drop(dead, [])
        assert int(await r.get(keys.discarded)) == 1 and await r.xlen(keys.dead) == 1
        await r.aclose()

    run(main())


def _own_server_cfg(tmp_path, appendonly: bool) -> tuple[EmbeddedRedis, Config]:
    server = EmbeddedRedis(
        Config.model_validate({"broker": {"appendonly": appendonly}}).broker, tmp_path / "redis"
    ).start()
    cfg = Config.model_validate(
        {
            "run": {"name": "restart", "dir": str(tmp_path)},
            "broker": {"redis_url": server.url},
            **GROUP,
        }
    )
    return server, cfg


def test_redis_restart_with_aof_loses_no_entry_and_keeps_pending(tmp_path):
    server, cfg = _own_server_cfg(tmp_path, appendonly=True)
    try:

        async def main():
            await _publish(cfg, [f"r{i}" for i in range(12)])
            r = connect_async(cfg.broker, cfg.run.dir)
            consumer = _consumer(r, cfg, "rank0")
            acked = await consumer.read(4, block_ms=100)
            await consumer.ack([d.entry_id for d in acked], [d.group.group_id for d in acked])
            held = await consumer.read(4, block_ms=100)
            server.restart()
            # the learner restarts too
            after = _consumer(r, cfg, "rank0")
            rest = await after.read(20, block_ms=100)
            await r.aclose()
            return acked, held, rest

        acked, held, rest = run(main())
        assert [d.group.group_id for d in rest] == [d.group.group_id for d in held] + [
            f"r{i}" for i in range(8, 12)
        ]
        assert [d.redelivered for d in rest] == [True] * 4 + [False] * 4
    finally:
        server.stop()


def test_redis_restart_without_persistence_recreates_the_group_and_consumes_on(tmp_path):
    server, cfg = _own_server_cfg(tmp_path, appendonly=False)
    try:

        async def main():
            r = connect_async(cfg.broker, cfg.run.dir)
            producer = RolloutProducer(r, Keys.from_config(cfg.run, cfg.broker), cfg.broker)
            consumer = _consumer(r, cfg, "rank0")
            await producer.publish(make_group("before"))
            got = await consumer.read(5, block_ms=100)
            # stream, group and counters are gone
            server.restart()
            # the stream is back, its group is not
            await producer.publish(make_group("after"))
            await consumer.ack([d.entry_id for d in got], [d.group.group_id for d in got])
            later = await consumer.read(5, block_ms=100)
            await r.aclose()
            return got, later

        got, later = run(main())
        assert [d.group.group_id for d in got] == ["before"]
        assert [d.group.group_id for d in later] == ["after"]
    finally:
        server.stop()


KILLED_CONSUMER = """
import json, os, sys, time
import asyncio
from streamrl.broker.client import connect_async
from streamrl.broker.keys import Keys
from streamrl.broker.semantics import Limits
from streamrl.broker.stream import RolloutConsumer
from streamrl.configs import Config
cfg = Config.model_validate(json.loads(os.environ["CFG"]))

async def main():
    consumer = RolloutConsumer(connect_async(cfg.broker, cfg.run.dir), Keys.from_config(cfg.run, cfg.broker), cfg.broker, Limits.from_config(cfg.rollout, cfg.broker, cfg.algo, cfg.completion_limit), "doomed", 1000)
    got = await consumer.read(int(sys.argv[1]), block_ms=2000)
    print(json.dumps([d.group.group_id for d in got]), flush=True)
    # SIGKILLed here, before any ack
    time.sleep(60)

asyncio.run(main())
"""


@pytest.mark.slow
def test_killed_consumer_entries_are_claimed_and_trained_once(redis_cfg):
    cfg = redis_cfg
    cfg.broker.claim_idle_ms = 300
    keys = Keys.from_config(cfg.run, cfg.broker)
    ids = [f"k{i}" for i in range(20)]
    run(_publish(cfg, ids))
    env = {**os.environ, "CFG": cfg.model_dump_json(), "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-c", KILLED_CONSUMER, "6"], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        taken = json.loads(proc.stdout.readline())
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    assert taken == ids[:6]
    sync = connect_sync(cfg.broker, cfg.run.dir)
    assert sync.xpending(keys.stream, cfg.broker.consumer_group)["pending"] == 6

    async def survivor():
        r = connect_async(cfg.broker, cfg.run.dir)
        consumer = _consumer(r, cfg, "rank1")
        trained: list[str] = []
        redelivered = []
        deadline = time.monotonic() + 10
        while len(trained) < len(ids) and time.monotonic() < deadline:
            got = await consumer.read(4, block_ms=50)
            await consumer.ack([d.entry_id for d in got], [d.group.group_id for d in got])
            trained += [d.group.group_id for d in got]
            redelivered += [d.group.group_id for d in got if d.redelivered]
        await r.aclose()
        return trained, redelivered

    trained, redelivered = run(survivor())
    assert sorted(trained) == sorted(ids) and len(trained) == len(set(trained))
    assert sorted(redelivered) == sorted(taken)
    assert sync.xlen(keys.stream) == 0
    assert sync.xpending(keys.stream, cfg.broker.consumer_group)["pending"] == 0


def test_connection_refused_surfaces_after_bounded_retries(redis_cfg, tmp_path):
    cfg = redis_cfg
    cfg.broker.retries = 2
    from streamrl.broker.server import free_port

    cfg.broker.redis_url = f"redis://127.0.0.1:{free_port()}/0"

    async def main():
        r = connect_async(cfg.broker, cfg.run.dir)
        try:
            start = time.monotonic()
            with pytest.raises(redis.ConnectionError):
                await _consumer(r, cfg, "rank0").read(1, block_ms=10)
            return time.monotonic() - start
        finally:
            await r.aclose()

    assert run(main()) < 5


def test_acks_larger_than_one_script_call_are_split_and_complete(redis_cfg, monkeypatch):
    from streamrl.broker import stream

    monkeypatch.setattr(stream, "SCRIPT_CHUNK", 5)
    cfg = redis_cfg
    keys = Keys.from_config(cfg.run, cfg.broker)
    ids = [f"c{i}" for i in range(12)]

    async def main():
        await _publish(cfg, ids)
        r = connect_async(cfg.broker, cfg.run.dir)
        consumer = _consumer(r, cfg, "rank0")
        got = await consumer.read(20, block_ms=100)
        assert [d.group.group_id for d in got] == ids
        await consumer.ack([d.entry_id for d in got], [d.group.group_id for d in got], 12)
        assert await r.xlen(keys.stream) == 0 and await r.scard(keys.trained) == 12
        assert int(await r.get(keys.consumed)) == 12
        await r.aclose()

    run(main())


def test_entries_acknowledged_to_producers_survive_a_sigkilled_redis_with_aof(tmp_path):
    # Redis write()s the AOF before it replies, so a process crash loses nothing even with
    # fsync everysec; only a machine crash can lose the last second (appendfsync=always closes that).
    cfg_broker = Config.model_validate({"broker": {"appendonly": True}}).broker
    server = EmbeddedRedis(cfg_broker, tmp_path / "redis").start()
    cfg = Config.model_validate(
        {"run": {"name": "crash"}, "broker": {"redis_url": server.url}, **GROUP}
    )
    try:
        ids = [f"f{i}" for i in range(30)]
        run(_publish(cfg, ids))
        # SIGKILL: no shutdown, no final flush
        server.kill()
        server.restart()

        async def main():
            r = connect_async(cfg.broker, cfg.run.dir)
            got = await _consumer(r, cfg, "rank0").read(50, block_ms=100)
            await r.aclose()
            return [d.group.group_id for d in got]

        assert run(main()) == ids
    finally:
        server.stop()
