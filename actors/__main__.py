"""``python -m streamrl.actors --config X [--actor-id ID] [dotted.key=value ...]``: one actor.

Generates, scores and publishes until SIGTERM/SIGINT. It is what a supervisor starts, once per
actor: ``streamrl run`` and ``streamrl actors --count N`` (``launch.host``, which restarts and
places each one). Actors find Redis through the config (``broker.redis_url``, ``REDIS_URL`` or the
run directory of ``make run``) and may join or leave a running system at any time.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading

import redis

from streamrl.actors.prompt_data import PromptDataError
from streamrl.configs import Config, config_from_cli
from streamrl.configs.errors import ConfigError
from streamrl.configs.runfiles import enter_run_dir
from streamrl.runtime.stacks import dump_stacks_on_request


def _parse(argv: list[str] | None) -> tuple[argparse.Namespace, Config]:
    parser = argparse.ArgumentParser(
        prog="python -m streamrl.actors", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--actor-id", help="actor id (default host-pid)")
    return config_from_cli(parser, argv)


def main(argv: list[str] | None = None) -> int:
    args, cfg = _parse(argv)
    # what it writes in run.dir (eval rows, its agent URL) goes only where its user alone has a say
    # and is its user's only (configs.runfiles: the run-directory policy)
    try:
        enter_run_dir(cfg.run.dir, cfg.run.shared_read)
    except ConfigError as exc:
        print(f"actor: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    # a supervisor giving up on a stop asks where it hung (launch.supervisor.stop_child)
    dump_stacks_on_request()
    return _run_here(cfg, args.actor_id)


def _run_here(cfg: Config, actor_id: str | None) -> int:
    """Be the actor: load, connect, loop until SIGTERM/SIGINT, shut down (``loop.run_actor``)."""
    # here, not at the top: --help and a bad config answer without loading torch and transformers
    from streamrl.actors.loop import run_actor

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    try:
        run_actor(cfg, actor_id or f"{cfg.run.host_id}-{os.getpid()}", stop)
    # raised while loading, before Redis
    except (PromptDataError, FileNotFoundError) as exc:
        print(exc, file=sys.stderr)
        return 2
    # the broker out of reach past broker.retries (a host cut off, Redis down): an outage, not a
    # bug, so one line; exit 1, and the supervisor restarts the actor with backoff
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        print(f"actor: Redis out of reach past broker.retries: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
