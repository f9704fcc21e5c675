"""``streamrl example``: make an example's policy and data at the paths its config names.

No config key builds a model or data: a run loads what is at its paths or stops, naming the key
and, for one of these paths, this command. ``streamrl example demo`` makes the CPU demo's warmed
policy and prompts (``configs.example_inputs.EXAMPLES`` lists every example and its paths);
``--policy`` and ``--data`` put them elsewhere. ``streamrl example --config CONFIG [key=value
...]`` makes the example inputs a config names and nothing else (``make run`` calls it before
``streamrl run``, so a fresh clone's ``make run`` just works and a config of the user's own makes
nothing). Idempotent: it says what it made and what was there already.

Made as a run's files are (``configs.runfiles``): the folder each goes in is checked first (this
user's, writable by nobody else, nor a folder above it), a link at a path is refused, the umask
makes every file the user's only, and each is written under a temporary name in its folder and
renamed into place (so two makers may race).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path

from streamrl.configs import load_config
from streamrl.configs.errors import ConfigError
from streamrl.configs.example_inputs import EXAMPLES, example_making
from streamrl.configs.load import refuse_secrets
from streamrl.configs.runfiles import check_trusted, restrict_umask

# the option that moves each key's path
OPTIONS = {"model.path": "--policy", "data.path": "--data", "supervised.path": "--data"}


def makers() -> dict[str, dict[str, Callable]]:
    """example -> {key: fn(path, seed=seed)}, the same keys as ``EXAMPLES`` (imported only here:
    a refusal costs no torch import)."""
    from streamrl.examples import longtail_copy, multiturn, reverse_digits

    return {
        "demo": {
            "model.path": reverse_digits.build_policy,
            "data.path": reverse_digits.write_dataset,
        },
        "sft": {
            "model.path": reverse_digits.build_initial_policy,
            "supervised.path": reverse_digits.write_warm_start_dataset,
        },
        "dpo": {
            "model.path": reverse_digits.build_policy,
            "supervised.path": reverse_digits.write_preference_dataset,
        },
        "longtail": {
            "model.path": longtail_copy.build_policy,
            "data.path": longtail_copy.write_dataset,
        },
        "multiturn": {
            "model.path": multiturn.build_policy,
            "data.path": reverse_digits.write_dataset,
        },
    }


def check_target(key: str, path: str) -> None:
    """ConfigError naming ``key`` (and its option) when ``path`` is a link, or its folder is one
    another user could change (they could swap the policy a run then loads)."""
    if os.path.islink(path):
        raise ConfigError(
            f"{key} ({OPTIONS[key]}) {path!r} is a symlink; an example's input is made only at a "
            "real path"
        )
    check_trusted(
        Path(path).parent,
        key=f"the folder of {key} ({OPTIONS[key]})",
        advice="another user could swap the policy or data a run then loads: choose a folder of "
        "your own, or make it yours and not writable by others",
    )


def make(
    targets: list[tuple[str, str, str]], seed: int = 0, say: Callable[[str], None] = print
) -> list[str]:
    """Make each ``(example, key, path)`` that is missing (all checked before any is made);
    returns the paths made."""
    for _name, key, path in targets:
        check_target(key, path)
    made = []
    built = makers()
    for name, key, path in targets:
        if os.path.exists(path):
            say(f"{key} {path}: there already, kept")
            continue
        say(f"{key} {path}: making {name}'s (seed {seed})")
        built[name][key](path, seed=seed)
        made.append(path)
    return made


def example_targets(name: str, policy: str | None, data: str | None) -> list[tuple[str, str, str]]:
    """``name``'s ``(example, key, path)``, the paths its config names unless moved."""
    moved = {"--policy": policy, "--data": data}
    return [(name, key, moved[OPTIONS[key]] or path) for key, path in EXAMPLES[name].items()]


def config_targets(config: str, overrides: list[str]) -> list[tuple[str, str, str]]:
    """The ``(example, key, path)`` of each path ``config`` names that an example makes there."""
    cfg = load_config(config, overrides)
    named = {
        "model.path": cfg.model.path,
        "data.path": cfg.data.path,
        "supervised.path": cfg.supervised.path,
    }
    out = []
    for key, path in named.items():
        along = tuple(p for k, p in named.items() if p and k != key)
        if path and (name := example_making(path, along, key)):
            out.append((name, key, path))
    return out


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="streamrl example",
        description="make an example's policy and data where they are missing, at the paths its "
        "config names: " + ", ".join(EXAMPLES),
        epilog="--config CONFIG [key=value ...] instead of a name: make the example inputs that "
        "config names (none for a config of your own)",
    )
    p.add_argument("name", nargs="*", help=f"one of {', '.join(EXAMPLES)} (not with --config)")
    p.add_argument("--config", help="make the example inputs this config names")
    p.add_argument("--seed", type=int, default=0, help="seed of the policy and the data (0)")
    p.add_argument("--policy", help="where the policy goes (default: the example's model.path)")
    p.add_argument("--data", help="where the data goes (default: the example's data path)")
    return p


def targets_of(args: argparse.Namespace, p: argparse.ArgumentParser) -> list:
    if args.config is not None:
        if args.policy or args.data:
            p.error("--policy and --data move an example's paths: with --config, override them")
        refuse_secrets(args.name)
        return config_targets(args.config, args.name)
    if len(args.name) != 1 or args.name[0] not in EXAMPLES:
        p.error(f"name one example ({', '.join(EXAMPLES)}), or give --config")
    return example_targets(args.name[0], args.policy, args.data)


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = p.parse_intermixed_args(argv)
    try:
        targets = targets_of(args, p)
        # every file and folder made is this user's only, as a run's
        restrict_umask(False)
        make(targets, args.seed, say=lambda line: print(f"streamrl example: {line}", flush=True))
    except ConfigError as exc:
        print(f"streamrl example: {exc}", file=sys.stderr)
        return 2
    if not targets:
        print("streamrl example: the config names no example's input; nothing to make")
    return 0


if __name__ == "__main__":
    sys.exit(main())
