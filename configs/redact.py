"""The one redaction of secrets, for everything that leaves a process's memory.

The saved run config (``<run.dir>/config.yaml``), ``streamrl config show``, the trackers'
run configs (W&B, trackio), a config error and a logged Redis URL all go through this module.
A secret is: a schema field declared ``secret`` (``broker.password``); a value under a key named
like a secret (``*key*``, ``*token*``, ``*password*``, ``*secret*``) in the free-form parts of a
config (``reward.functions[].kwargs``: a judge's API key); and the credentials of any URL in it
(``redis://:pw@h``, ``https://user:pw@h/data``, ``redis://h/0?password=pw``), an unencoded ``@``
in a password included. Schema fields named like secrets that are not (``data.prompt_key``, a
``*_file`` path) stay, so a redacted config loads as the run's config.

The processes of a run get what was removed through ``SECRETS_ENV`` (and the Redis URL through
``REDIS_URL``) in their environment, which only their user can read; ``load_config`` puts it
back into the redacted file they load.
"""

from __future__ import annotations

import json
import re
import types
import typing
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel

MARK = "REDACTED"
# the environment variable carrying a run's secrets to its processes (JSON: [[path, value], ...])
SECRETS_ENV = "STREAMRL_SECRETS"
_SECRET_NAME = re.compile(r"key|token|passw|secret", re.I)

KeyPath = tuple[str | int, ...]


def secret_name(name: object) -> bool:
    """Whether a free-form key names a secret: ``api_key``, ``hf_token``, ``db_password``..."""
    return isinstance(name, str) and _SECRET_NAME.search(name) is not None


def redact_url(url: str) -> str:
    """``scheme://user:pw@host/...?password=pw`` -> ``scheme://user:REDACTED@host/...?password=REDACTED``.

    The credentials end at the last ``@`` before the query, so an unencoded ``@`` in a password
    does not leak its tail; without a ``:`` the whole user part is taken as a token. Text with
    no ``://`` is returned as it is.
    """
    return _rewrite_url(url, keep_marked=True)


def strip_url(url: str) -> str:
    """``url`` with its credentials and secret query parameters removed, not masked: what another
    host may be told (``streamrl actors --join``), to add its own password to."""
    return _rewrite_url(url, keep_marked=False)


def _rewrite_url(url: str, keep_marked: bool) -> str:
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    query_at = rest.find("?")
    head, query = (rest, "") if query_at < 0 else (rest[:query_at], rest[query_at:])
    at = head.rfind("@")
    if at >= 0:
        user, colon, _ = head[:at].partition(":")
        shown = f"{user}:{MARK}" if colon and "/" not in user else MARK
        head = f"{shown}@{head[at + 1 :]}" if keep_marked else head[at + 1 :]
    if query:
        pairs = []
        for pair in query[1:].split("&"):
            name, eq, _ = pair.partition("=")
            if eq and (secret_name(name) or name.lower() in ("pass", "pwd", "auth")):
                if not keep_marked:
                    continue
                pair = f"{name}={MARK}"
            pairs.append(pair)
        query = "?" + "&".join(pairs) if pairs else ""
    return f"{scheme}://{head}{query}"


def redact_text(text: str) -> str:
    """Every URL inside ``text`` (a log line, an error message) redacted."""
    return re.sub(r"[a-z][a-z0-9+.-]*://\S+", lambda m: redact_url(m[0]), text, flags=re.I)


def section_of(annotation) -> type[BaseModel] | None:
    """The config section a field holds (``X``, ``X | None``, ``list[X]``), if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType, list):
        for arg in typing.get_args(annotation):
            if found := section_of(arg):
                return found
    return None


def is_secret_field(section: type[BaseModel] | None, key: object) -> bool:
    field = section.model_fields.get(key) if section and isinstance(key, str) else None
    extra = field.json_schema_extra if field is not None else None
    return isinstance(extra, dict) and bool(extra.get("secret"))


def _walk(node: Any, section: type[BaseModel] | None, path: KeyPath, found: list) -> Any:
    """``node`` with its secrets replaced; each (path, original) appended to ``found``.

    ``section`` is the schema model ``node`` is an instance of; None inside a free-form dict.
    """
    if isinstance(node, list):
        return [_walk(v, section, (*path, i), found) for i, v in enumerate(node)]
    if not isinstance(node, dict):
        if isinstance(node, str) and "://" in node and redact_url(node) != node:
            found.append((path, node))
            return redact_url(node)
        return node
    out = {}
    for key, value in node.items():
        here = (*path, key)
        field = section.model_fields.get(key) if section and isinstance(key, str) else None
        if is_secret_field(section, key):
            # None, not the mark: the redacted config still validates and loads
            if value is not None:
                found.append((here, value))
            out[key] = None
        elif (
            field is None
            and secret_name(key)
            and isinstance(value, (str, int))
            and not isinstance(value, bool)
        ):
            # a str or an int: a float under such a key is a number (a reward part's bar)
            found.append((here, value))
            out[key] = MARK
        else:
            out[key] = _walk(value, section_of(field.annotation) if field else None, here, found)
    return out


def split(cfg: BaseModel) -> tuple[dict[str, Any], list[tuple[KeyPath, Any]]]:
    """(``cfg`` as JSON-able data with every secret removed, the (path, value) pairs removed)."""
    found: list[tuple[KeyPath, Any]] = []
    tree = _walk(cfg.model_dump(mode="json"), type(cfg), (), found)
    return tree, found


def redacted(cfg: BaseModel) -> dict[str, Any]:
    """``cfg`` (a Config) as plain JSON-able data, every default spelled out, secrets removed."""
    return split(cfg)[0]


def secrets_env(cfg: BaseModel) -> str:
    """What a run's processes get in ``SECRETS_ENV``: the secrets ``redacted`` removes."""
    return json.dumps([[list(path), value] for path, value in split(cfg)[1]])


def restore(data: dict[str, Any], env: Mapping[str, str]) -> dict[str, Any]:
    """``data`` (a loaded config file) with the secrets of ``env[SECRETS_ENV]`` put back."""
    raw = env.get(SECRETS_ENV)
    if not raw:
        return data
    data = json.loads(json.dumps(data))
    for path, value in json.loads(raw):
        node = data
        for part in path[:-1]:
            if isinstance(node, dict):
                node = node.setdefault(part, {})
            elif isinstance(node, list) and isinstance(part, int) and part < len(node):
                node = node[part]
            else:
                break
        else:
            if isinstance(node, dict) or (isinstance(node, list) and path[-1] < len(node)):
                node[path[-1]] = value
    return data


def shown_value(key: object, value: Any) -> Any:
    """``value`` as a message may show it: a value under a secret-looking key is masked, URLs
    lose their credentials."""
    if secret_name(key):
        return MARK
    return redact_text(value) if isinstance(value, str) else value
