"""Load a YAML file or a shipped preset, apply dotted overrides, validate against the schema.

Errors name the key, the file and the reason, and nothing starts half-way: a
process calls ``load_config`` before it touches Redis, shm or a model. This is the
one place that reads ``REDIS_URL``: it lands in ``broker.redis_url``.
"""

from __future__ import annotations

import argparse
import difflib
import importlib.resources
import os
import sys
import types
import typing
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from streamrl.configs import foreign, renamed, yamlfile
from streamrl.configs.errors import ConfigError
from streamrl.configs.redact import (
    is_secret_field,
    redact_text,
    redacted,
    restore,
    shown_value,
)
from streamrl.configs.runfiles import write_new
from streamrl.configs.schema import Config

Overrides = Iterable[str] | Mapping[str, Any]
PRESET_SUFFIX = ".yaml"
# what a run saves in its directory (launch.supervisor), so --config takes a run directory too
RUN_CONFIG = "config.yaml"
# where a secret refused on the command line (refuse_secrets) comes from instead
SECRET_SOURCES = {
    ("broker", "password"): "set STREAMRL_REDIS_PASSWORD or broker.password_file instead",
}


def parse_overrides(overrides: Iterable[str]) -> dict[str, Any]:
    """``["learner.lr=1e-5", "rollout.stop=[a, b]"]`` -> nested dict; values are YAML scalars.

    A numeric part indexes a list: ``reward.functions.0.weight=0.5`` changes the first reward
    of the file's list, and an index one past its end appends (``reward.functions.1.fn=math``).
    """
    return _plain(_override_tree(overrides))


def _override_tree(overrides: Iterable[str]) -> dict[str, Any]:
    pairs = []
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep:
            raise ConfigError(f"override {item!r}: expected dotted.key=value")
        # the error names its problem only: the YAML error's snippet of the text may be a secret
        shown = shown_value(key.rsplit(".", 1)[-1], raw)
        where = f"override {key}: cannot parse value {shown!r}"
        pairs.append((key, yamlfile.parse(raw, where) if raw.strip() else ""))
    return _tree(pairs)


class _Value:
    """An override's value: it replaces what the file has there, even a mapping
    (``run.target_parts={}`` clears the bars), where the sections above it merge."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


def _plain(tree: Any) -> Any:
    if isinstance(tree, _Value):
        return tree.value
    return {k: _plain(v) for k, v in tree.items()} if isinstance(tree, dict) else tree


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
        node[leaf] = _Value(value)
    return tree


def _is_index(key: str) -> bool:
    return key.isdigit()


def _merge(base: dict[str, Any], extra: dict[str, Any], where: str = "") -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        here = f"{where}{key}"
        if isinstance(value, _Value):
            out[key] = value.value
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value, f"{here}.")
        elif isinstance(value, dict) and isinstance(out.get(key), list):
            out[key] = _merge_list(out[key], value, here)
        else:
            out[key] = _listify(value, here)
    return out


def _merge_list(base: list, extra: dict[str, Any], where: str) -> list:
    """Overrides ``where.<i>...`` into the list ``base``: each index an existing item or the next."""
    out = list(base)
    for key in sorted(extra, key=lambda k: int(k) if _is_index(k) else -1):
        if not _is_index(key):
            raise ConfigError(f"override {where}.{key}: {where} is a list; index it with a number")
        index, value = int(key), extra[key]
        if index > len(out):
            raise ConfigError(
                f"override {where}.{key}: {where} has {len(out)} item(s); "
                f"indices run 0..{len(out)} ({len(out)} appends one)"
            )
        if isinstance(value, _Value):
            value = value.value
            if index == len(out):
                out.append(value)
            else:
                out[index] = value
        elif index == len(out):
            out.append(_listify(value, f"{where}.{key}"))
        elif isinstance(value, dict) and isinstance(out[index], dict):
            out[index] = _merge(out[index], value, f"{where}.{key}.")
        else:
            out[index] = _listify(value, f"{where}.{key}")
    return out


def _listify(value: Any, where: str) -> Any:
    """Index-keyed override dicts with no list under them (``reward.functions.0.fn=x`` with no
    reward in the file) become lists; indices must then run from 0 without gaps."""
    if isinstance(value, _Value):
        return value.value
    if not isinstance(value, dict):
        return value
    if value and all(_is_index(k) for k in value):
        indices = sorted(int(k) for k in value)
        if indices != list(range(len(indices))):
            raise ConfigError(
                f"override {where}: the list has no items yet, so its indices must run 0, 1, ... "
                f"(got {', '.join(map(str, indices))})"
            )
        return [_listify(value[str(i)], f"{where}.{i}") for i in indices]
    return {k: _listify(v, f"{where}.{k}") for k, v in value.items()}


def _model_at(loc: tuple) -> type | None:
    """The config section (pydantic model) that holds the last key of ``loc``."""
    node: Any = Config
    for part in loc[:-1]:
        if isinstance(part, int):
            args = [a for a in typing.get_args(node) if a is not type(None)]
            node = args[0] if args else None
        elif isinstance(node, type) and issubclass(node, BaseModel) and part in node.model_fields:
            node = node.model_fields[part].annotation
        else:
            return None
        # list[X] | None -> list[X]
        args = [a for a in typing.get_args(node) if a is not type(None)]
        if typing.get_origin(node) in (typing.Union, types.UnionType) and len(args) == 1:
            node = args[0]
    return node if isinstance(node, type) and issubclass(node, BaseModel) else None


def _did_you_mean(loc: tuple) -> str:
    """Where an older streamrl's key went, TRL's or verl's name for the key, else the closest key
    of its section."""
    if renamed.hint(".".join(map(str, loc))):
        return renamed.hint(".".join(map(str, loc)))
    if isinstance(loc[-1], str) and foreign.hint(loc[-1]):
        return foreign.hint(loc[-1])
    model = _model_at(loc)
    if model is None or not isinstance(loc[-1], str):
        return ""
    close = difflib.get_close_matches(loc[-1], list(model.model_fields), n=1, cutoff=0.6)
    prefix = ".".join(str(p) for p in loc[:-1])
    return f"; did you mean {prefix + '.' if prefix else ''}{close[0]}?" if close else ""


def _format(exc: ValidationError, source: str) -> str:
    lines = [f"invalid config ({source}):"]
    for err in exc.errors():
        key = ".".join(str(p) for p in err["loc"]) or "<root>"
        reason = err["msg"]
        if err["type"] == "extra_forbidden":
            reason = "unknown key" + _did_you_mean(tuple(err["loc"]))
        shown = err.get("input")
        if err["type"] == "missing" or isinstance(shown, dict):
            lines.append(f"  {key}: {reason}")
        else:
            # a rejected password is still a password
            last = err["loc"][-1] if err["loc"] else ""
            lines.append(f"  {key}: {reason} (got {shown_value(last, shown)!r})")
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
    """(source, text) of a YAML file, of the shipped preset of that name (a bare name that is
    no file here, ``demo_cpu``, so it is found from any directory), or of the config a run
    directory saved."""
    path = Path(path_or_preset)
    name = str(path_or_preset)
    if path.is_dir():
        if not (path / RUN_CONFIG).is_file():
            raise ConfigError(
                f"config {name}: a directory without a saved run config ({RUN_CONFIG})"
            )
        path, name = path / RUN_CONFIG, str(path / RUN_CONFIG)
    is_name = isinstance(path_or_preset, str) and not path.suffix and os.sep not in name
    if is_name and not path.exists():
        if name not in presets():
            raise ConfigError(
                f"config {name!r}: no such file and no such preset (presets: {', '.join(presets())})"
            )
        preset = importlib.resources.files("streamrl.configs") / f"{name}{PRESET_SUFFIX}"
        return f"preset {name}", preset.read_text()
    return name, yamlfile.read_text(path, f"config file {name}")


def read_tree(path_or_preset: str | os.PathLike) -> tuple[str, dict[str, Any]]:
    """(source, the mapping) of a config file, preset or run directory (``_read``), through the
    bounded YAML reader (``yamlfile``)."""
    source, text = _read(path_or_preset)
    return source, yamlfile.parse_mapping(text, f"config file {source}")


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
        source, data = read_tree(path_or_preset)
    if isinstance(overrides, Mapping):
        tree = _tree(overrides.items())
    else:
        tree = _override_tree(overrides or ())
    if tree:
        data = _merge(data, tree)
        source += " + overrides"
    renamed.refuse_removed(data, source)
    if env.get("REDIS_URL"):
        data = _merge(data, {"broker": {"redis_url": env["REDIS_URL"]}})
    data = restore(data, env)
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_format(exc, source)) from None


def config_text(cfg: Config) -> str:
    """``cfg`` whole (every default spelled out) as YAML, secrets redacted (``configs.redact``)."""
    return yaml.safe_dump(redacted(cfg), sort_keys=False)


def write_config(cfg: Config, path: str | os.PathLike) -> Path:
    """Write ``config_text(cfg)``, which ``load_config`` reads back equal but for the redacted
    secrets (``SECRETS_ENV`` puts them back); mode 0600 (it names hosts and paths), 0644 with
    ``run.shared_read``. A file or link already there is replaced, never written through."""
    path = Path(path)
    write_new(path, config_text(cfg), shared_read=cfg.run.shared_read)
    return path


def config_from_cli(
    parser: argparse.ArgumentParser, argv: list[str] | None = None
) -> tuple[argparse.Namespace, Config]:
    """Add ``--config`` and the dotted overrides to ``parser``, parse ``argv`` and load the config.

    A bad config ends the process with exit code 2 and the message, before anything starts.
    """
    parser.add_argument(
        "--config",
        help=f"a preset name ({', '.join(presets())}), a YAML file or a run directory; built-in defaults without it",
    )
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. learner.lr=1e-5")
    # overrides may come before, between and after the options
    args = parser.parse_intermixed_args(argv)
    try:
        refuse_secrets(args.overrides)
    except ConfigError as exc:
        print(f"{parser.prog}: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    try:
        return args, load_config(args.config, args.overrides)
    except ConfigError as exc:
        print(redact_text(str(exc)), file=sys.stderr)
        raise SystemExit(2) from None


def refuse_secrets(overrides: Iterable[str]) -> None:
    """ConfigError for an override of a field the schema declares secret (``broker.password``):
    a command line is in every local user's ``ps`` for the life of the process, and every role
    of a run parses its overrides here."""
    for item in overrides:
        key = item.partition("=")[0].strip()
        loc = tuple(int(p) if _is_index(p) else p for p in key.split("."))
        if is_secret_field(_model_at(loc), loc[-1]):
            where = SECRET_SOURCES.get(loc, "put it in the config file (mode 0600) instead")
            raise ConfigError(
                f"{key} on the command line is visible to every local user (ps): {where}"
            )
