"""``streamrl broker --config X [key=value ...]``: serve the run's Redis until SIGINT/SIGTERM.

The broker role of a run on several hosts, and what ``python -m streamrl.broker`` runs on one.
``broker.host`` picks the interface (loopback by default) and ``broker.port`` the port (6379
unless set: the port the docs' ``--join redis://HOST:6379/0`` names); any other address needs
Redis 7 (``broker.server``) and a password, which comes from ``STREAMRL_REDIS_PASSWORD`` or
``broker.password_file`` (mode 0600), never the command line. With ``broker.tls_cert_file`` and ``broker.tls_key_file`` it serves TLS
only. Prints the URL (password masked) and the ``--join`` URL other hosts pass to ``streamrl
actors``, and writes the URL to ``<run.dir>/redis.url`` so processes of this host find it. With
``REDIS_URL`` (or ``broker.redis_url``) set it starts nothing: it checks that Redis answers and
exits.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path

import redis

from streamrl.broker.client import connect_sync, url_file
from streamrl.broker.password import PasswordError, with_password
from streamrl.broker.server import BROKER_PORT, EmbeddedRedis, RedisServerError
from streamrl.configs import config_from_cli
from streamrl.configs.errors import ConfigError
from streamrl.configs.redact import redact_url, strip_url
from streamrl.configs.runfiles import enter_run_dir


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="streamrl broker", description=__doc__.splitlines()[0])
    args, cfg = config_from_cli(parser, argv)
    try:
        broker = with_password(cfg.broker)
    except PasswordError as exc:
        print(f"streamrl broker: {exc}", file=sys.stderr)
        return 2

    if cfg.broker.redis_url:
        client = connect_sync(cfg.broker, cfg.run.dir)
        try:
            client.ping()
        except redis.RedisError as exc:
            print(
                f"broker: external Redis at {redact_url(cfg.broker.redis_url)}: {exc}",
                file=sys.stderr,
            )
            return 1
        finally:
            client.close()
        print(
            f"external Redis at {redact_url(cfg.broker.redis_url)} answers; starting none",
            flush=True,
        )
        return 0

    if broker.port is None:
        broker = broker.model_copy(update={"port": BROKER_PORT})
    stop = threading.Event()
    try:
        # refuses an unsafe bind before anything, signal handlers included, is set up
        server = EmbeddedRedis(broker, Path(cfg.run.dir) / "redis", url_file=url_file(cfg.run.dir))
        # the run-directory policy (configs.runfiles): Redis's files (data, log) and the URL file
        # are this user's only, in a directory only this user can change, through no link
        enter_run_dir(cfg.run.dir, cfg.run.shared_read, dirs=("redis",))
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
        server.start()
    except RedisServerError as exc:
        print(f"broker: {exc}", file=sys.stderr)
        return 1
    except ConfigError as exc:
        print(f"streamrl broker: {exc}", file=sys.stderr)
        return 2
    print(f"redis ready at {redact_url(server.url)} (url in {url_file(cfg.run.dir)})", flush=True)
    print(f"other hosts: streamrl actors --join {strip_url(server.url)} --count N", flush=True)
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
