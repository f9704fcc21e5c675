"""Load a YAML preset, apply dotted overrides, validate against the schema.

Errors name the key, the file and the reason, and nothing starts half-way: a
process calls ``load_config`` before it touches Redis, shm or a model.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from streamrl.configs.errors import ConfigError
from streamrl.configs.schema import Config


def parse_overrides(overrides: Iterable[str]) -> dict[str, Any]:
    """``["learner.lr=1e-5", "rollout.stop=[a, b]"]`` -> nested dict; values are YAML scalars."""
    tree: dict[str, Any] = {}
    for item in overrides:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key or any(not part for part in key.split(".")):
            raise ConfigError(f"override {item!r}: expected dotted.key=value")
        try:
            value = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError as exc:
            raise ConfigError(f"override {key}: cannot parse value {raw!r}: {exc}") from None
        node = tree
        *parents, leaf = key.split(".")
        for part in parents:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"override {key}: {part} is set to a value and used as a section")
            node = child
        node[leaf] = value
    return tree


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def _format(exc: ValidationError, source: str) -> str:
    lines = [f"invalid config ({source}):"]
    for err in exc.errors():
        key = ".".join(str(p) for p in err["loc"]) or "<root>"
        reason = err["msg"]
        if err["type"] == "extra_forbidden":
            reason = "unknown key"
        shown = err.get("input")
        if err["type"] == "missing" or isinstance(shown, dict):
            lines.append(f"  {key}: {reason}")
        else:
            lines.append(f"  {key}: {reason} (got {shown!r})")
    return "\n".join(lines)


def load_config(
    path: str | os.PathLike | None = None,
    overrides: Iterable[str] = (),
    env: dict[str, str] | None = None,
) -> Config:
    """Read ``path`` (YAML, optional), apply ``overrides``, then ``REDIS_URL`` from the environment."""
    env = os.environ if env is None else env
    data: dict[str, Any] = {}
    source = "defaults"
    if path is not None:
        source = str(path)
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise ConfigError(f"config file {path}: {exc.strerror}") from None
        try:
            loaded = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {path}: not valid YAML: {exc}") from None
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigError(
                f"config file {path}: top level must be a mapping, got {type(loaded).__name__}"
            )
        data = loaded
    overrides = list(overrides)
    if overrides:
        data = _merge(data, parse_overrides(overrides))
        source += " + overrides"
    if env.get("REDIS_URL"):
        data = _merge(data, {"broker": {"redis_url": env["REDIS_URL"]}})
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_format(exc, source)) from None


def config_from_cli(
    parser: argparse.ArgumentParser, argv: list[str] | None = None
) -> tuple[argparse.Namespace, Config]:
    """Add ``--config`` and the dotted overrides to ``parser``, parse ``argv`` and load the config.

    A bad config ends the process with exit code 2 and the message, before anything starts.
    """
    parser.add_argument(
        "--config", help="YAML preset (configs/*.yaml); built-in defaults without it"
    )
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. learner.lr=1e-5")
    args = parser.parse_args(argv)
    try:
        return args, load_config(args.config, args.overrides)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        raise SystemExit(2) from None
