"""Change the number of actors of a running `make run` without restarting anything.

    python -m streamrl.launch.scale --config configs/demo_cpu.yaml --actors 4     (make scale ACTORS=4)

The supervisor reads the wanted count from a Redis list. Actors started by
hand (`make actors N=2`, i.e. `python -m streamrl.actors --count 2`) join the same run
through Redis and leave with Ctrl-C; they are not supervised.
"""

from __future__ import annotations

import argparse
import json
import sys

from streamrl.broker.client import connect_sync
from streamrl.broker.keys import Keys
from streamrl.configs import config_from_cli


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="streamrl scale", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--actors", type=int, required=True, help="wanted number of supervised actors"
    )
    args, cfg = config_from_cli(parser, argv)
    if not 0 <= args.actors <= cfg.actor.max_actors:
        parser.error(f"--actors must be between 0 and actor.max_actors={cfg.actor.max_actors}")
    client = connect_sync(cfg.broker, cfg.run.dir)
    client.rpush(
        Keys.from_config(cfg.run, cfg.broker).launch_control, json.dumps({"actors": args.actors})
    )
    print(f"asked the supervisor of run {cfg.run.name!r} for {args.actors} actors")
    return 0


if __name__ == "__main__":
    sys.exit(main())
