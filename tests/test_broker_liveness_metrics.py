"""Heartbeats expire with their actor; every process's metrics endpoint is served and registered."""

from __future__ import annotations

import asyncio
import urllib.request

# the stream metrics the endpoint serves: a process that has a stream has imported them
import streamrl.broker.metrics  # noqa: F401
from streamrl.broker.client import connect_async, connect_sync
from streamrl.broker.keys import Keys
from streamrl.broker.liveness import Heartbeats, alive_actors
from streamrl.configs.schema import BrokerConfig
from streamrl.runtime import metrics_endpoint


def test_an_actor_that_stops_beating_drops_out_of_alive(redis_cfg):
    cfg = redis_cfg
    # dead after 3 missed beats = 150 ms
    cfg.actor.heartbeat_s = 0.05

    sync = connect_sync(cfg.broker, cfg.run.dir)

    async def main():
        r = connect_async(cfg.broker, cfg.run.dir)
        hb = Heartbeats(r, Keys.from_config(cfg.run, cfg.broker), cfg.actor.heartbeat_s)
        await hb.beat("a0", version=3, tokens_per_s=120.5)
        await hb.beat("a1")
        alive = alive_actors(sync, hb.keys)
        assert [a["id"] for a in alive] == ["a0", "a1"]
        assert alive[0]["version"] == "3" and float(alive[0]["tokens_per_s"]) == 120.5
        # a1 keeps beating, a0 was killed
        for _ in range(4):
            await asyncio.sleep(0.05)
            await hb.beat("a1")
        assert [a["id"] for a in alive_actors(sync, hb.keys)] == ["a1"]
        # pruned
        assert await r.zrange(hb.keys.actors, 0, -1) == [b"a1"]
        await hb.forget("a1")
        assert alive_actors(sync, hb.keys) == []
        await r.aclose()

    asyncio.run(main())


def test_metrics_endpoint_serves_stream_metrics_and_registers_its_target(redis_cfg):
    cfg = redis_cfg
    endpoint = metrics_endpoint.Endpoint.from_config(cfg.metrics, cfg.broker, cfg.run)
    port = metrics_endpoint.serve(endpoint, "learner", "0")
    try:
        target = connect_sync(cfg.broker, cfg.run.dir).hget(
            Keys.from_config(cfg.run, cfg.broker).metrics_targets, "learner:0"
        )
        assert target == f"127.0.0.1:{port}".encode()
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        for name in (
            "streamrl_stream_length",
            "streamrl_stream_produced_total",
            "streamrl_stream_dead_letter_total",
        ):
            assert name in body
    finally:
        metrics_endpoint.unregister(endpoint, "learner", "0", port)
    assert (
        connect_sync(cfg.broker, cfg.run.dir).hget(
            Keys.from_config(cfg.run, cfg.broker).metrics_targets, "learner:0"
        )
        is None
    )


def test_disabled_metrics_serve_nothing_and_register_nowhere(tmp_path):
    # no Redis configured: registering would raise RedisNotConfigured
    endpoint = metrics_endpoint.Endpoint(
        enabled=False,
        host="127.0.0.1",
        broker=BrokerConfig(),
        run_dir=str(tmp_path),
        targets_key="streamrl:off:metrics:targets",
    )
    assert metrics_endpoint.serve(endpoint, "actor", "a0") == 0
