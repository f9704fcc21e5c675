"""Remove every Redis key of one run: ``python -m streamrl.broker.cleanup --config X [key=value ...]``.

A run's keys all live under ``streamrl:{run.name}:`` (``broker.keys.Keys``),
so SCAN + UNLINK on that prefix removes exactly this run's state and nothing
of another run sharing the server. Meant for after a run is stopped: the
stream, the ``trained`` set and the counters are the run's memory, and a
learner resumed later against an emptied Redis would re-train nothing it has
acked but would lose the backlog.

What counts as leaked after a clean stop (``ephemeral_leftovers``): state that
belongs to a live process and must be gone once every process exited cleanly
(heartbeat hashes, members of the alive-actors zset, unexpired admission
leases, metrics scrape targets). A SIGKILLed actor's lease is left to expire
after ``broker.lease_ttl_s`` by design; once expired it holds no slot, so it is
not a leak even while no ``try_start`` has pruned it yet. Everything else is
run state kept until this cleanup.
"""

from __future__ import annotations

import argparse
import sys

import redis

from streamrl.broker.client import RedisNotConfigured, connect_sync
from streamrl.broker.keys import Keys
from streamrl.configs import ConfigError, load_config

SCAN_COUNT = 1000


def run_keys(client: redis.Redis, keys: Keys) -> list[bytes]:
    """Every key under the run's prefix (SCAN, so a big server is not blocked)."""
    pattern = keys.prefix.replace("[", r"\[").replace("]", r"\]") + "*"
    return sorted(client.scan_iter(match=pattern, count=SCAN_COUNT))


def delete_run_keys(client: redis.Redis, keys: Keys) -> int:
    """UNLINK every key of the run; returns how many went."""
    found = run_keys(client, keys)
    removed = 0
    for i in range(0, len(found), SCAN_COUNT):
        removed += client.unlink(*found[i : i + SCAN_COUNT])
    return removed


def ephemeral_leftovers(client: redis.Redis, keys: Keys) -> dict[str, object]:
    """Per-process state still present; empty after every process of the run stopped cleanly."""
    left: dict[str, object] = {}
    heartbeats = [k.decode() for k in client.scan_iter(match=keys.actor("*"), count=SCAN_COUNT)]
    if heartbeats:
        left["heartbeats"] = heartbeats
    if members := client.zrange(keys.actors, 0, -1):
        left["alive actors"] = [m.decode() for m in members]
    # leases are scored by their expiry on Redis's clock
    seconds, micros = client.time()
    now_ms = seconds * 1000 + micros // 1000
    if leases := client.zrangebyscore(keys.leases, now_ms, "+inf"):
        left["admission leases"] = [m.decode() for m in leases]
    if targets := client.hkeys(keys.metrics_targets):
        left["metrics targets"] = sorted(t.decode() for t in targets)
    return left


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m streamrl.broker.cleanup", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--config", help="YAML preset (configs/*.yaml)")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. run.name=demo")
    args = parser.parse_args(argv)
    try:
        cfg = load_config(args.config, args.overrides)
        client = connect_sync(cfg.broker, cfg.run.dir)
    except (ConfigError, RedisNotConfigured) as exc:
        print(exc, file=sys.stderr)
        return 2
    keys = Keys.from_config(cfg.run, cfg.broker)
    try:
        removed = delete_run_keys(client, keys)
    except redis.RedisError as exc:
        print(f"cleanup of run {cfg.run.name!r} failed: {exc}", file=sys.stderr)
        return 1
    finally:
        client.close()
    print(f"removed {removed} key(s) of run {cfg.run.name!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
