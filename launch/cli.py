"""The ``streamrl`` console script (also ``python -m streamrl``): one program, one subcommand per job.

argparse subparsers give ``streamrl --help``, ``streamrl --version`` and a clear error for an
unknown command; each subcommand's module parses its own options under the program name
``streamrl <command>``, so ``streamrl run --help`` lists them and an unknown flag is named.
The modules stay runnable alone (``python -m streamrl.learner`` is what the supervisor starts).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import NamedTuple

from streamrl import __version__


class Command(NamedTuple):
    module: str
    summary: str


COMMANDS = {
    "run": Command(
        "streamrl.launch.__main__",
        "Redis, the learner and N actors with a live view (make run); resumes a checkpoint in run.dir",
    ),
    "broker": Command(
        "streamrl.broker.__main__",
        "the run's Redis alone, on a chosen interface, for learners and actors on other hosts",
    ),
    "learner": Command(
        "streamrl.launch.learner",
        "the learner alone: one rank, torchrun's ranks, or one node of several (--nnodes)",
    ),
    "sft": Command("streamrl.launch.sft", "supervised fine-tuning on the learner from a dataset"),
    "dpo": Command(
        "streamrl.launch.dpo", "DPO (sigmoid or IPO) on the learner from preference pairs"
    ),
    "example": Command(
        "streamrl.examples.assets_cli",
        "make an example's policy and data (demo, sft, dpo, ...) at the paths its preset names",
    ),
    "actors": Command(
        "streamrl.launch.host",
        "N supervised actors on this host, joining a run (--join: a broker on another host)",
    ),
    "scale": Command(
        "streamrl.launch.scale", "change the number of a run's supervised actors (make scale)"
    ),
    "export": Command(
        "streamrl.learner.export", "write the latest checkpoint as a Hugging Face folder"
    ),
    "inspect": Command(
        "streamrl.launch.inspect",
        "stream, pending and dead-letter entries, decoded, and the counters",
    ),
    "dashboard": Command(
        "streamrl.launch.dashboard", "Prometheus and the live dashboard (make dashboard)"
    ),
    "plot": Command("streamrl.launch.plot", "plot a run's learner steps as PNGs (RUN_DIR/plots)"),
    "config": Command(
        "streamrl.configs.__main__",
        "show a resolved config (secrets redacted), or convert a TRL or verl one",
    ),
}


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="streamrl",
        description="Asynchronous actor-learner RL for language models.",
        epilog="--config takes a preset name, a YAML file or a run directory; dotted key=value "
        "arguments override any setting. `streamrl <command> --help` shows a command's options.",
    )
    top.add_argument("--version", action="version", version=f"streamrl {__version__}")
    sub = top.add_subparsers(dest="command", metavar="<command>", required=True)
    for name, command in COMMANDS.items():
        # the command's own module parses (and documents) the rest
        sub.add_parser(name, help=command.summary, add_help=False)
    return top


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in COMMANDS:
        # --help, --version, or an error naming what is wrong (no or unknown command, unknown flag)
        parser().parse_args(argv)
    return importlib.import_module(COMMANDS[argv[0]].module).main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
