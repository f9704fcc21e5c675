"""streamrl's own keys that moved, for the loader's unknown-key hint: a config written for an
older streamrl fails naming where each of its keys went.

Each engine's and transport's own settings became a section of its name (``actor.<engine>``,
``weightsync.<transport>``) when the schema started composing them from the registries.
"""

from __future__ import annotations

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


def hint(key: str) -> str:
    """``"; weightsync.relay moved: it is weightsync.dist.relay now"``, or ""."""
    if key not in RENAMED:
        return ""
    return f"; {key} moved: it is {' or '.join(RENAMED[key])} now"
