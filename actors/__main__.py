"""``python -m streamrl.actors --config X [--count N] [--actor-id ID] [dotted.key=value ...]``

Starts N actor processes (each its own OS process and actor id) that generate,
score and publish until SIGTERM/SIGINT. With ``--count 1`` the actor runs in
this process. Actors find Redis through the config (``broker.redis_url``,
``REDIS_URL`` or the run directory of ``make run``) and may join or leave a
running system at any time.
"""

from __future__ import annotations

import argparse
import logging
import signal
import subprocess
import sys
import threading

from streamrl.actors.prompts import PromptDataError
from streamrl.configs import Config, config_from_cli


def _parse(argv: list[str] | None) -> tuple[argparse.Namespace, Config]:
    parser = argparse.ArgumentParser(prog="streamrl actors", description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=1, help="actor processes to start")
    parser.add_argument(
        "--actor-id", help="actor id (default host-pid; with --count N, ID-0 .. ID-N-1)"
    )
    return config_from_cli(parser, argv)


def _spawn_children(args: argparse.Namespace) -> int:
    """Run ``--count`` single-actor children, forward SIGTERM/SIGINT to them, wait for all."""
    children = []
    for i in range(args.count):
        cmd = [sys.executable, "-m", "streamrl.actors", "--count", "1"]
        if args.config:
            cmd += ["--config", args.config]
        if args.actor_id:
            cmd += ["--actor-id", f"{args.actor_id}-{i}"]
        overrides = list(args.overrides) + ([] if i == 0 else ["actor.metrics_port=0"])
        children.append(subprocess.Popen(cmd + overrides))

    def forward(signum, _frame) -> None:
        for child in children:
            if child.poll() is None:
                child.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    codes = [child.wait() for child in children]
    return max(codes, key=abs)


def main(argv: list[str] | None = None) -> int:
    args, cfg = _parse(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if args.count < 1:
        print("--count must be >= 1", file=sys.stderr)
        return 2
    if args.count > 1:
        return _spawn_children(args)
    return _run_here(cfg, args.actor_id)


def _run_here(cfg: Config, actor_id: str | None) -> int:
    """Be the actor: load, connect, loop until SIGTERM/SIGINT, shut down (``loop.run_actor``)."""
    # here, not at the top: a parent of --count N children never loads torch and transformers
    from streamrl.actors.loop import default_actor_id, run_actor

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    try:
        run_actor(cfg, actor_id or default_actor_id(), stop)
    # raised while loading, before Redis
    except (PromptDataError, FileNotFoundError) as exc:
        print(exc, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
