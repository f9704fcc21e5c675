"""``streamrl run`` (``make run``): the command line of ``streamrl.run``.

streamrl run --config demo_cpu --actors 2 [--overwrite | --resume] [dotted.key=value ...]
"""

from __future__ import annotations

import argparse
import sys

from streamrl.configs import StreamRLError, config_from_cli
from streamrl.configs.redact import redact_text
from streamrl.launch.run import run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="streamrl run",
        description="Start Redis, the learner and N actors on this machine, with a live view.",
    )
    parser.add_argument("--actors", type=int, default=2, help="actor processes to start")
    parser.add_argument(
        "--resume",
        action="store_true",
        help="insist on a checkpoint in run.dir to continue from (one there is resumed anyway)",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="start over in a run.dir that holds an earlier run: removes what streamrl wrote there, nothing else",
    )
    args, cfg = config_from_cli(parser, argv)
    try:
        result = run(cfg, actors=args.actors, resume=args.resume, overwrite=args.overwrite)
    # A missing model or tokenizer file surfaces from the libraries that read it.
    except (StreamRLError, FileNotFoundError) as exc:
        print(f"streamrl run: {redact_text(str(exc))}", file=sys.stderr)
        return 2
    return 1 if result.failure else 0


if __name__ == "__main__":
    sys.exit(main())
