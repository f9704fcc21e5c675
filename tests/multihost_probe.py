"""A probe the multi-host test runs on the broker's host: one JSON line of the run's state per line
read from stdin. Started once, because each Python start costs seconds on a loaded 2-core machine.

argv: RUN_NAME; the URL (with its password) in REDIS_URL
"""

from __future__ import annotations

import json
import os
import sys

import redis

from streamrl.broker.keys import Keys
from streamrl.broker.liveness import alive_actors
from streamrl.broker.wire import decode_group
from streamrl.weightsync.hosts import relay_stats_key


def snapshot(client: redis.Redis, keys: Keys) -> dict:
    stats = {k.decode(): int(float(v)) for k, v in client.hgetall(relay_stats_key(keys)).items()}
    return {
        "version": int(client.get(keys.version) or 0),
        "actors": {
            a["id"]: {
                "version": int(float(a.get("version", 0))),
                "pid": int(a.get("pid", 0)),
                "weights_from": a.get("weights_from", ""),
            }
            for a in alive_actors(client, keys)
        },
        "relay": stats,
        "queued": [decode_group(f[b"g"]).group_id for _, f in client.xrange(keys.stream)],
    }


def main() -> None:
    client = redis.Redis.from_url(os.environ["REDIS_URL"], socket_timeout=10)
    keys = Keys(sys.argv[1])
    for _ in sys.stdin:
        try:
            out = snapshot(client, keys)
        except redis.RedisError as exc:
            out = {"error": repr(exc)}
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
