"""Load a YAML file or a shipped preset, apply dotted overrides, validate against the schema.

Errors name the key, the file and the reason, and nothing starts half-way: a
process calls ``load_config`` before it touches Redis, shm or a model. This is the
one place that reads ``REDIS_URL``: it lands in ``broker.redis_url``.
"""

from __future__ import annotations

import argparse
import importlib.resources
import os
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from streamrl.configs.errors import ConfigError
from streamrl.configs.schema import Config

Overrides = Iterable[str] | Mapping[str, Any]
PRESET_SUFFIX = ".yaml"


def parse_overrides(overrides: Iterable[str]) -> dict[str, Any]:
    """``["learner.lr=1e-5", "rollout.stop=[a, b]"]`` -> nested dict; values are YAML scalars."""
    pairs = []
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep:
            raise ConfigError(f"override {item!r}: expected dotted.key=value")
        try:
            value = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError as exc:
            raise ConfigError(f"override {key}: cannot parse value {raw!r}: {exc}") from None
        pairs.append((key, value))
    return _tree(pairs)


def _tree(pairs: Iterable[tuple[str, Any]]) -> dict[str, Any]:
    """``[("learner.lr", 1e-5)]`` -> ``{"learner": {"lr": 1e-5}}``."""
    tree: dict[str, Any] = {}
    for key, value in pairs:
        key = key.strip()
        if not key or any(not part for part in key.split(".")):
            raise ConfigError(f"override {key!r}: expected dotted.key=value")
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


def presets() -> list[str]:
    """The names of the presets shipped inside the package (``configs/<name>.yaml``)."""
    folder = importlib.resources.files("streamrl.configs")
    return sorted(
        entry.name.removesuffix(PRESET_SUFFIX)
        for entry in folder.iterdir()
        if entry.name.endswith(PRESET_SUFFIX)
    )


def _read(path_or_preset: str | os.PathLike) -> tuple[str, str]:
    """(source, text) of a YAML file, or of the shipped preset of that name: a bare name that is
    no file here (``demo_cpu``) is a preset, so it is found from any directory."""
    path = Path(path_or_preset)
    name = str(path_or_preset)
    is_name = isinstance(path_or_preset, str) and not path.suffix and os.sep not in name
    if is_name and not path.exists():
        if name not in presets():
            raise ConfigError(
                f"config {name!r}: no such file and no such preset (presets: {', '.join(presets())})"
            )
        preset = importlib.resources.files("streamrl.configs") / f"{name}{PRESET_SUFFIX}"
        return f"preset {name}", preset.read_text()
    try:
        return name, path.read_text()
    except OSError as exc:
        raise ConfigError(f"config file {name}: {exc.strerror}") from None


def load_config(
    path_or_preset: str | os.PathLike | None = None,
    overrides: Overrides | None = None,
    env: Mapping[str, str] | None = None,
) -> Config:
    """Read a YAML file or a shipped preset (built-in defaults with None), apply ``overrides``,
    then ``REDIS_URL`` from ``env`` (the process environment unless given).

    ``overrides`` are ``"dotted.key=value"`` strings (values parsed as YAML, as on the command
    line) or a mapping of dotted keys to values: ``{"run.max_steps": 2}``.
    """
    env = os.environ if env is None else env
    data: dict[str, Any] = {}
    source = "defaults"
    if path_or_preset is not None:
        source, text = _read(path_or_preset)
        try:
            loaded = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {source}: not valid YAML: {exc}") from None
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigError(
                f"config file {source}: top level must be a mapping, got {type(loaded).__name__}"
            )
        data = loaded
    if isinstance(overrides, Mapping):
        tree = _tree(overrides.items())
    else:
        tree = parse_overrides(overrides or ())
    if tree:
        data = _merge(data, tree)
        source += " + overrides"
    if env.get("REDIS_URL"):
        data = _merge(data, {"broker": {"redis_url": env["REDIS_URL"]}})
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_format(exc, source)) from None


def write_config(cfg: Config, path: str | os.PathLike) -> Path:
    """Write ``cfg`` whole (every default spelled out) as YAML that ``load_config`` reads back
    equal; mode 0600 from the first byte, since it may hold the Redis password."""
    path = Path(path)
    text = yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        # an older file of the same name keeps its mode through O_TRUNC
        os.fchmod(f.fileno(), 0o600)
        f.write(text)
    return path


def config_from_cli(
    parser: argparse.ArgumentParser, argv: list[str] | None = None
) -> tuple[argparse.Namespace, Config]:
    """Add ``--config`` and the dotted overrides to ``parser``, parse ``argv`` and load the config.

    A bad config ends the process with exit code 2 and the message, before anything starts.
    """
    parser.add_argument(
        "--config",
        help=f"a preset name ({', '.join(presets())}) or a YAML file; built-in defaults without it",
    )
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. learner.lr=1e-5")
    args = parser.parse_args(argv)
    try:
        return args, load_config(args.config, args.overrides)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        raise SystemExit(2) from None
