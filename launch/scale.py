"""Change the number of actors of a running `make run` without restarting anything.

    python -m streamrl.launch.scale --config configs/demo_cpu.yaml --actors 4     (make scale ACTORS=4)

The supervisor reads the wanted count from a Redis list. ``--host H`` scales the actors that
``streamrl actors`` supervises on host H instead (``launch.host``; each host has a list of
its own).
"""

from __future__ import annotations

import argparse
import json
import sys

from streamrl.broker.client import connect_sync
from streamrl.broker.keys import Keys
from streamrl.configs import config_from_cli
from streamrl.launch.host import control_key


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="streamrl scale", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--actors", type=int, required=True, help="wanted number of supervised actors"
    )
    parser.add_argument(
        "--host",
        metavar="HOST_ID",
        help="scale the actors `streamrl actors` supervises on this host (its run.host_id) "
        "instead of those of `streamrl run`",
    )
    args, cfg = config_from_cli(parser, argv)
    if not 0 <= args.actors <= cfg.actor.max_actors:
        parser.error(f"--actors must be between 0 and actor.max_actors={cfg.actor.max_actors}")
    key = Keys.from_config(cfg.run, cfg.broker).launch_control
    if args.host:
        key = control_key(key, args.host)
    client = connect_sync(cfg.broker, cfg.run.dir)
    client.rpush(key, json.dumps({"actors": args.actors}))
    where = f" on host {args.host!r}" if args.host else ""
    print(f"asked the supervisor of run {cfg.run.name!r}{where} for {args.actors} actors")
    return 0


if __name__ == "__main__":
    sys.exit(main())
