"""Several hosts in one view: every process's scrape target carries its ``run.host_id``, and
``streamrl inspect`` and the live view list each host with its actors and their weight versions.
Real metric endpoints and a real Redis; the heartbeats are the actors' own (``Heartbeats.beat``)."""

from __future__ import annotations

import asyncio

from rich.console import Console

from streamrl.broker.client import connect_async, connect_sync
from streamrl.broker.keys import Keys
from streamrl.broker.liveness import Heartbeats, alive_actors
from streamrl.launch.inspect import collect, render
from streamrl.launch.scrape import live_targets
from streamrl.launch.status import Snapshot
from streamrl.launch.view import live_table
from streamrl.runtime import metrics_endpoint
from streamrl.weightsync.announce import announce
from streamrl.weightsync.hosts import host_keys, relay_stats_key


def test_every_scrape_target_is_labelled_with_its_host_and_a_wildcard_bind_registers_a_route(
    redis_cfg,
):
    keys = Keys.from_config(redis_cfg.run, redis_cfg.broker)
    ports = []
    for host_id, bind in (("hostA", "127.0.0.1"), ("hostC", "0.0.0.0")):
        run = redis_cfg.run.model_copy(update={"host_id": host_id})
        endpoint = metrics_endpoint.Endpoint.from_config(
            redis_cfg.metrics.model_copy(update={"host": bind}), redis_cfg.broker, run
        )
        ports.append((endpoint, metrics_endpoint.serve(endpoint, "actor", f"{host_id}-a0")))
    client = connect_sync(redis_cfg.broker, redis_cfg.run.dir)
    try:
        groups = live_targets(keys, client)
        for endpoint, port in ports:
            metrics_endpoint.unregister(endpoint, "actor", f"{endpoint.host_id}-a0", port)
        left = client.hlen(keys.metrics_hosts)
    finally:
        client.close()
    assert [(g["labels"]["host"], g["labels"]["actor"]) for g in groups] == [
        ("hostA", "hostA-a0"),
        ("hostC", "hostC-a0"),
    ]
    # bound to every interface, registered at the address the route to Redis leaves from
    assert groups[1]["targets"] == [f"127.0.0.1:{ports[1][1]}"]
    assert left == 0


def test_inspect_and_the_live_view_list_each_host_with_its_actors_and_versions(redis_cfg):
    keys = Keys.from_config(redis_cfg.run, redis_cfg.broker)

    async def beat() -> None:
        client = connect_async(redis_cfg.broker, redis_cfg.run.dir)
        beats = Heartbeats(client, keys, heartbeat_s=30.0)
        await beats.beat("hostA-a0", version=7, host="hostA")
        await beats.beat("hostC-a0", version=6, host="hostC")
        await beats.beat("hostC-a1", version=5, host="hostC")
        await client.aclose()

    asyncio.run(beat())
    client = connect_sync(redis_cfg.broker, redis_cfg.run.dir)
    try:
        announce(client, host_keys(keys, "hostC"), 6, "shm", "relay:hostC", {})
        client.hincrby(relay_stats_key(keys), "hostC:versions", 6)
        client.hincrby(relay_stats_key(keys), "hostC:bytes", 600)
        report = collect(client, keys, redis_cfg.broker, count=1)
        actors = alive_actors(client, keys)
    finally:
        client.close()
    assert report["hosts"] == {
        "hostA": {"actors": {"hostA-a0": 7}, "weights_version": None, "relay_received": {}},
        "hostC": {
            "actors": {"hostC-a0": 6, "hostC-a1": 5},
            "weights_version": 6,
            "relay_received": {"versions": 6, "bytes": 600},
        },
    }
    shown = render(report)
    assert "host hostC: hostC-a0@v6, hostC-a1@v5; weights v6, relay received 6 versions" in shown
    console = Console(record=True, width=200)
    console.print(live_table(Snapshot(at=0.0, actors=actors), 1.0, []))
    assert (
        "3 on 2 host(s): hostA: hostA-a0@v7 · hostC: hostC-a0@v6, hostC-a1@v5"
        in console.export_text()
    )
