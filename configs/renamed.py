"""streamrl's own keys that moved, for the loader's unknown-key hint: a config written for an
older streamrl fails naming where each of its keys went.

Each engine's and transport's own settings became a section of its name (``actor.<engine>``,
``weightsync.<transport>``) when the schema started composing them from the registries. The
``build`` hooks that made a missing model or dataset went: no config key builds or fills in an
input, ``streamrl example`` makes the examples' (``refuse_removed``).
"""

from __future__ import annotations

from typing import Any

from streamrl.configs.errors import ConfigError

# the old dotted key -> the key(s) it became
RENAMED: dict[str, tuple[str, ...]] = {
    "actor.cuda_graphs": ("actor.hf.cuda_graphs",),
    "actor.gpu_memory_utilization": ("actor.vllm.gpu_memory_utilization",),
    "actor.tensor_parallel_size": ("actor.vllm.tensor_parallel_size",),
    "weightsync.slots": (
        "weightsync.shm.slots",
        "weightsync.cuda_ipc.slots",
        "weightsync.dist.relay_slots",
    ),
    "weightsync.bucket_bytes": ("weightsync.dist.bucket_bytes", "actor.vllm.bucket_bytes"),
    "weightsync.backend": ("weightsync.dist.backend",),
    "weightsync.dist_host": ("weightsync.dist.host",),
    "weightsync.dist_port": ("weightsync.dist.port",),
    "weightsync.dist_ports": ("weightsync.dist.ports",),
    "weightsync.relay": ("weightsync.dist.relay",),
}


# the sections whose `build` hook made a missing `path`: the hook would run code in place of an
# input the user named, so a config naming one stops rather than train on something else
REMOVED_HOOKS = ("model", "data", "supervised")


def refuse_removed(tree: dict[str, Any], source: str) -> None:
    """ConfigError, in one line naming the key and what replaced it, when ``tree`` (a config
    before validation) still names a removed ``build`` hook."""
    for section in REMOVED_HOOKS:
        node = tree.get(section)
        if isinstance(node, dict) and "build" in node:
            raise ConfigError(
                f"{section}.build ({source}) was removed: no config key builds a model or data. "
                f"Make the path first (the examples': `streamrl example <name>`) and delete "
                f"{section}.build"
            )


def hint(key: str) -> str:
    """``"; weightsync.relay moved: it is weightsync.dist.relay now"``, or ""."""
    if key not in RENAMED:
        return ""
    return f"; {key} moved: it is {' or '.join(RENAMED[key])} now"
