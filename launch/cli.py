"""The ``streamrl`` console script: one entry point for the make targets.

streamrl run --config C [--actors N] [key=value ...]     make run
streamrl actors --config C [--count N]                   make actors
streamrl scale --config C --actors N                     make scale
streamrl export --config C [--out DIR]                   export the policy (Hugging Face folder)
streamrl inspect --config C [--count N] [--json]         stream, pending, dead letters, counters
streamrl dashboard --config C                            make dashboard (Prometheus + live view)
"""

from __future__ import annotations

import importlib
import sys

COMMANDS = {
    "run": "streamrl.launch.__main__",
    "actors": "streamrl.actors.__main__",
    "scale": "streamrl.launch.scale",
    "export": "streamrl.learner.export",
    "inspect": "streamrl.launch.inspect",
    "dashboard": "streamrl.launch.dashboard",
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0
    if not argv or argv[0] not in COMMANDS:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    return importlib.import_module(COMMANDS[argv[0]]).main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
