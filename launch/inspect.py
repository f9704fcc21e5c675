"""``streamrl inspect``: what a run's Redis holds, decoded (stream entries are msgpack bytes).

    streamrl inspect --config configs/demo_cpu.yaml [--count 5] [--json]

Prints the admission counters (policy version, accepted, consumed, live leases, capacity),
the last ``--count`` stream entries, the learner's pending entries (consumer, idle time,
delivery count), the dead-letter entries with the reason each was refused, and the announced
weights (over shared memory: which readers are copying a slot right now), each host with its
live actors and their weight versions (and what its relay received), and the GPUs the
supervisor gave each process (``<run.dir>/placement.json``). Entries are
decoded with the same validating decoder the learner uses; one that does not decode is
shown with the decoder's reason, never executed or trusted. Names in Redis are names, not
paths: a segment name that is not one of the run's segments, or a host that is not one name, is
shown refused with the reason and nothing is opened by it; the run directory (perhaps another
user's) is read without following a link in it and written never.
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np
import redis

from streamrl.broker.client import RedisNotConfigured, connect_sync
from streamrl.broker.keys import Keys
from streamrl.broker.liveness import alive_actors
from streamrl.broker.wire import WireError, decode_group
from streamrl.configs import config_from_cli
from streamrl.configs.schema import BrokerConfig
from streamrl.launch import placement
from streamrl.launch.status import by_host
from streamrl.weightsync import transports
from streamrl.weightsync.announce import read_announcement
from streamrl.weightsync.hosts import host_keys, relay_stats_key
from streamrl.weightsync.transports import UnknownTransport


def describe_payload(payload: bytes | None, max_bytes: int) -> dict:
    """A decoded group as a short summary, or the reason it does not decode."""
    if payload is None:
        return {"error": "entry has no payload field 'g'"}
    try:
        g = decode_group(payload, max_bytes=max_bytes)
    except WireError as exc:
        return {"error": str(exc), "bytes": len(payload)}
    rewards = [c.reward for c in g.completions]
    versions = [int(v) for c in g.completions for v in c.versions]
    return {
        "group_id": g.group_id,
        "actor": g.actor_id,
        "prompt_id": g.prompt_id,
        "completions": len(g.completions),
        "tokens": sum(len(c) for c in g.completions),
        "reward_mean": round(float(np.mean(rewards)), 4) if rewards else None,
        "versions": [min(versions), max(versions)] if versions else [],
        "created_at": g.created_at,
    }


def _text(value) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def collect(client: redis.Redis, keys: Keys, broker: BrokerConfig, count: int) -> dict:
    limit = broker.max_entry_bytes
    leases = client.zcard(keys.leases)
    report: dict = {
        "run": keys.run_name,
        "admission": {
            "version": int(client.get(keys.version) or 0),
            "accepted": int(client.get(keys.accepted) or 0),
            "consumed": int(client.get(keys.consumed) or 0),
            "live_leases": int(leases),
        },
        "stream": {"length": int(client.xlen(keys.stream)), "last": []},
        "pending": [],
        "dead_letter": {"length": int(client.xlen(keys.dead)), "last": []},
    }
    for entry_id, fields in client.xrevrange(keys.stream, count=count):
        report["stream"]["last"].append(
            {"id": _text(entry_id), **describe_payload(fields.get(b"g"), limit)}
        )
    try:
        pending = client.xpending_range(
            keys.stream, broker.consumer_group, min="-", max="+", count=count
        )
    # the consumer group appears with the learner's first read
    except redis.ResponseError:
        pending = []
    for p in pending:
        report["pending"].append(
            {
                "id": _text(p["message_id"]),
                "consumer": _text(p["consumer"]),
                "idle_ms": int(p["time_since_delivered"]),
                "deliveries": int(p["times_delivered"]),
            }
        )
    for entry_id, fields in client.xrevrange(keys.dead, count=count):
        report["dead_letter"]["last"].append(
            {
                "id": _text(entry_id),
                "source_id": _text(fields.get(b"source_id", b"")),
                "reason": _text(fields.get(b"reason", b"")),
                **describe_payload(fields.get(b"g"), limit),
            }
        )
    report["weights"] = _weights(client, keys)
    report["hosts"] = _hosts(client, keys)
    return report


def _hosts(client: redis.Redis, keys: Keys) -> dict:
    """Each host of the run: its live actors with their weight versions, the version announced
    for its shared memory (by its relay, or the learner on its own host) and what its relay
    received."""
    received: dict[str, dict[str, int]] = {}
    for field, value in client.hgetall(relay_stats_key(keys)).items():
        host, _, what = _text(field).rpartition(":")
        received.setdefault(host, {})[what] = int(value)
    grouped = by_host(alive_actors(client, keys))
    out = {}
    for host in sorted(set(grouped) | set(received)):
        try:
            ann = read_announcement(client, host_keys(keys, host))
        except ValueError:
            ann = None
        out[host] = {
            "actors": {a["id"]: int(a.get("version", 0)) for a in grouped.get(host, [])},
            "weights_version": ann.version if ann is not None else None,
            "relay_received": received.get(host, {}),
        }
    return out


def _weights(client: redis.Redis, keys: Keys) -> dict | None:
    """The announced weights and, over shared memory, the readers copying a slot right now."""
    try:
        ann = read_announcement(client, keys)
    except ValueError as exc:
        return {"error": str(exc)}
    if ann is None:
        return None
    out = {"version": ann.version, "transport": ann.transport, "published_at": ann.published_at}
    try:
        transport = transports.get(ann.transport)
    except UnknownTransport as exc:
        return {**out, "error": str(exc)}
    return {**out, **transport.describe(ann.meta, keys.run_name)}


def render(report: dict) -> str:
    a = report["admission"]
    lines = [
        f"run {report['run']}: policy version {a['version']}, accepted {a['accepted']}, "
        f"consumed {a['consumed']}, live leases {a['live_leases']}, "
        f"in flight or queued {a['accepted'] + a['live_leases'] - a['consumed']}",
        f"stream: {report['stream']['length']} entries; last {len(report['stream']['last'])}:",
    ]
    lines += [f"  {json.dumps(e)}" for e in report["stream"]["last"]]
    lines.append(f"pending (read by the learner, not acked): {len(report['pending'])}")
    lines += [f"  {json.dumps(e)}" for e in report["pending"]]
    lines.append(f"dead letter: {report['dead_letter']['length']} entries")
    lines += [f"  {json.dumps(e)}" for e in report["dead_letter"]["last"]]
    lines.append(
        f"weights: {json.dumps(report['weights']) if report['weights'] else 'none announced'}"
    )
    for host, h in report.get("hosts", {}).items():
        actors = ", ".join(f"{ident}@v{v}" for ident, v in h["actors"].items()) or "no actors"
        relay = h["relay_received"]
        got = f", relay received {relay.get('versions', 0)} versions" if relay else ""
        lines.append(f"host {host}: {actors}; weights v{h['weights_version']}{got}")
        if line := _gpus(h.get("placement")):
            lines.append(f"  {line}")
    if line := _gpus(report.get("placement")):
        lines.append(line)
    return "\n".join(lines)


def _gpus(recorded: dict | str | None) -> str | None:
    """The line of a recorded placement (``_placement``): the GPUs, or why it was not read."""
    if isinstance(recorded, str):
        return f"GPUs: placement not read: {recorded}"
    if recorded:
        return f"GPUs (CUDA_VISIBLE_DEVICES): {placement.describe(recorded)}"
    return None


def _placement(run_dir: str, host: str | None = None) -> dict | str | None:
    """``placement.read`` of the run (``host``'s, a name from Redis), or why it was refused."""
    try:
        return placement.read(run_dir, host)
    except ValueError as exc:
        return str(exc)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="streamrl inspect", description=__doc__.strip().splitlines()[0]
    )
    parser.add_argument("--count", type=int, default=5, help="entries to show per list")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args, cfg = config_from_cli(parser, argv)
    try:
        client = connect_sync(cfg.broker, cfg.run.dir)
        report = collect(client, Keys.from_config(cfg.run, cfg.broker), cfg.broker, args.count)
        report["placement"] = _placement(cfg.run.dir)
        for host, h in report["hosts"].items():
            h["placement"] = _placement(cfg.run.dir, host)
    except (RedisNotConfigured, redis.RedisError) as exc:
        print(f"inspect: cannot reach the run's Redis: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(report) if args.json else render(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
