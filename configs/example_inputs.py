"""The inputs ``streamrl example <name>`` makes (``streamrl.examples.assets_cli``), at the paths
the shipped presets and example configs name for them (tests/test_configs.py holds each config
to this table), and the command a start that finds one of them missing names.

No config key builds an input: a run loads what is at its paths or stops, and the examples'
toy policies and prompts are made by that one explicit command (``make run`` calls it first).
"""

from __future__ import annotations

import os

# example -> {key: the path its config names} (the demo's policy is also dpo's and the copy task's)
EXAMPLES: dict[str, dict[str, str]] = {
    "demo": {"model.path": "runs/demo-policy", "data.path": "runs/demo-data/train.jsonl"},
    "sft": {"model.path": "runs/demo-init", "supervised.path": "runs/demo-sft-data/train.jsonl"},
    "dpo": {"model.path": "runs/demo-policy", "supervised.path": "runs/demo-dpo-data/train.jsonl"},
    "longtail": {
        "model.path": "runs/longtail-policy",
        "data.path": "runs/longtail-data/train.jsonl",
    },
    "multiturn": {
        "model.path": "runs/multiturn-policy-v3",
        "data.path": "runs/demo-data/train.jsonl",
    },
}


def example_making(
    path: str | os.PathLike, along: tuple[str, ...] = (), key: str | None = None
) -> str | None:
    """The example whose command makes ``path`` (as a config names it; with ``key``, as that key's
    path), or None; of several, the first that also makes each of ``along`` (the config's other
    paths: the DPO preset's policy is the demo's too, but ``streamrl example dpo`` makes its pairs
    as well)."""
    wanted = os.path.normpath(path)
    found = [
        name
        for name, paths in EXAMPLES.items()
        if wanted in {os.path.normpath(p) for k, p in paths.items() if key is None or k == key}
    ]
    for name in found:
        if {os.path.normpath(p) for p in along} <= {
            os.path.normpath(p) for p in EXAMPLES[name].values()
        }:
            return name
    return found[0] if found else None


def missing(key: str, path: str, along: tuple[str, ...] = ()) -> str:
    """The one line for ``key``'s ``path`` that does not exist, naming the command that makes it
    when it is an example's (``example_making``)."""
    name = example_making(path, along)
    if name is None:
        return f"{key} {path!r} does not exist"
    return f"{key} {path!r} does not exist: make it with `streamrl example {name}`"
