"""``python -m streamrl.broker --config X [key=value ...]``: run the embedded Redis until SIGINT/SIGTERM.

Prints the URL (password masked) and writes it to ``<run.dir>/redis.url`` so
the learner and actors of the run find it. With ``REDIS_URL`` (or
``broker.redis_url``) set it starts nothing: it checks that Redis answers and exits.
"""

from __future__ import annotations

import argparse
import re
import signal
import sys
import threading
from pathlib import Path

import redis

from streamrl.broker.client import connect_sync, url_file
from streamrl.broker.server import EmbeddedRedis, RedisServerError
from streamrl.configs import config_from_cli


def masked(url: str) -> str:
    return re.sub(r"//([^@/]*):[^@/]*@", r"//\1:***@", url)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m streamrl.broker", description=__doc__.splitlines()[0]
    )
    _args, cfg = config_from_cli(parser, argv)

    if cfg.broker.redis_url:
        client = connect_sync(cfg.broker, cfg.run.dir)
        try:
            client.ping()
        except redis.RedisError as exc:
            print(
                f"broker: external Redis at {masked(cfg.broker.redis_url)}: {exc}", file=sys.stderr
            )
            return 1
        finally:
            client.close()
        print(
            f"external Redis at {masked(cfg.broker.redis_url)} answers; starting none", flush=True
        )
        return 0

    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        server = EmbeddedRedis(
            cfg.broker, Path(cfg.run.dir) / "redis", url_file=url_file(cfg.run.dir)
        ).start()
    except RedisServerError as exc:
        print(f"broker: {exc}", file=sys.stderr)
        return 1
    print(f"redis ready at {masked(server.url)} (url in {url_file(cfg.run.dir)})", flush=True)
    try:
        while not stop.wait(0.5):
            if server.proc.poll() is not None:
                print(
                    f"broker: redis-server exited with code {server.proc.returncode}",
                    file=sys.stderr,
                )
                return 1
    finally:
        server.stop()
    print("redis stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
