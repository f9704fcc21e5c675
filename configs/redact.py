"""The one redaction of secrets out of a config, for everything that leaves the process's memory.

The saved run config (``<run.dir>/config.yaml``), ``streamrl config show`` and the trackers'
run configs (W&B, trackio) all go through ``redacted``; nothing else writes a config out. The
secrets are the Redis password and the password inside a Redis URL. A redacted config still
loads: the password becomes None (a non-loopback embedded Redis then refuses to start until
one is set) and a URL keeps its host with the password replaced by ``REDACTED``. The processes
of a run get the real URL through ``REDIS_URL`` in their environment, which only their user
can read, so they load the redacted file.
"""

from __future__ import annotations

import re
from typing import Any

MARK = "REDACTED"
# dotted keys whose whole value is a secret
SECRET_KEYS = ("broker.password",)
# dotted keys holding a URL that may carry a password
URL_KEYS = ("broker.redis_url",)
_URL_PASSWORD = re.compile(r"^(?P<head>[a-z][a-z0-9+.-]*://[^:@/]*):(?P<secret>[^@/]*)@", re.I)


def redact_url(url: str) -> str:
    """``redis://user:pw@host:6379/0`` -> ``redis://user:REDACTED@host:6379/0``; other URLs unchanged."""
    return _URL_PASSWORD.sub(lambda m: f"{m['head']}:{MARK}@", url)


def _set(tree: dict, dotted: str, change) -> None:
    *parents, leaf = dotted.split(".")
    node = tree
    for part in parents:
        node = node.get(part)
        if not isinstance(node, dict):
            return
    if node.get(leaf) is not None:
        node[leaf] = change(node[leaf])


def redacted(cfg) -> dict[str, Any]:
    """``cfg`` (a Config) as plain JSON-able data, every default spelled out, secrets removed."""
    tree = cfg.model_dump(mode="json")
    for key in SECRET_KEYS:
        _set(tree, key, lambda _: None)
    for key in URL_KEYS:
        _set(tree, key, redact_url)
    return tree
