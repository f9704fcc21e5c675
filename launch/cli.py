"""The ``streamrl`` console script: one entry point for the make targets; each command parses its
own options (``streamrl <command> --help``)."""

from __future__ import annotations

import importlib
import sys
from typing import NamedTuple


class Command(NamedTuple):
    module: str
    synopsis: str
    summary: str


COMMANDS = {
    "run": Command(
        "streamrl.launch.__main__",
        "--config C [--actors N] [--resume] [key=value ...]",
        "Redis, the learner and N actors with a live view (make run)",
    ),
    "actors": Command(
        "streamrl.actors.__main__",
        "--config C [--count N]",
        "add actors to a running run (make actors)",
    ),
    "scale": Command(
        "streamrl.launch.scale",
        "--config C --actors N",
        "change the number of a run's supervised actors (make scale)",
    ),
    "export": Command(
        "streamrl.learner.export",
        "--config C [--out DIR]",
        "write the latest checkpoint as a Hugging Face folder",
    ),
    "inspect": Command(
        "streamrl.launch.inspect",
        "--config C [--count N] [--json]",
        "stream, pending and dead-letter entries, decoded, and the counters",
    ),
    "dashboard": Command(
        "streamrl.launch.dashboard",
        "--config C",
        "Prometheus and the live dashboard (make dashboard)",
    ),
}


def usage() -> str:
    lines = ["usage: streamrl <command> [options]", "", "commands:"]
    for name, command in COMMANDS.items():
        lines += [f"  streamrl {name} {command.synopsis}", f"      {command.summary}"]
    lines += [
        "",
        "C is a preset name (demo_cpu, ...) or a YAML file; key=value overrides any setting.",
        "`streamrl <command> --help` shows a command's options.",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in ("-h", "--help"):
        print(usage())
        return 0
    if not argv or argv[0] not in COMMANDS:
        problem = f"unknown command {argv[0]!r}" if argv else "no command given"
        print(f"{usage()}\n\nstreamrl: error: {problem}", file=sys.stderr)
        return 2
    return importlib.import_module(COMMANDS[argv[0]].module).main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
