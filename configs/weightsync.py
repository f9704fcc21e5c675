"""Moving new weights from the learner to the actors (``weightsync``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from streamrl.configs.section import Section

# The transports whose actors open the learner's GPU memory by CUDA IPC handle (the transport's
# ``device_ipc`` capability, which tests/test_weightsync_cuda_ipc.py holds to this): they need the
# learner's GPU visible to every actor on its host.
DEVICE_IPC_TRANSPORTS = frozenset({"cuda_ipc"})


class WeightSyncConfig(Section):
    """Moving new weights from the learner to the actors."""

    transport: Literal["shm", "cuda_ipc", "dist", "none"] = Field(
        "shm",
        description="shm = POSIX shared memory (one host); cuda_ipc = GPU actors on the learner's host copy each version device to device from slots on the learner's GPU, shared once as CUDA IPC handles (needs CUDA actors on the learner's host, actor.device cuda, no relay; with actor.gpus a list each actor also sees the learner's GPU, after its own, and copies from it peer to peer; costs `slots` copies of the weights in GPU memory on the learner's GPU); dist = torch.distributed broadcast (NCCL/gloo); none = actors keep version 0.",
    )
    slots: int = Field(
        3,
        ge=2,
        description="shm, cuda_ipc: ring of slots, so the publisher never overwrites a slot a reader is copying (cuda_ipc: on the learner's GPU).",
    )
    staging_buffers: int = Field(
        2,
        ge=1,
        le=4,
        description="shm: host buffers the learner copies each version into before a background thread writes it out (pinned when the learner is on a GPU). The learner waits only when the next one is still being written out; each costs one copy of the weights in the transfer dtype.",
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto",
        description="Dtype weights travel in; converted once on the publisher side (auto = engine dtype).",
    )
    bucket_bytes: int = Field(64 << 20, ge=1 << 16, description="dist: broadcast bucket size.")
    timeout_s: float = Field(
        30.0,
        gt=0,
        description="Upper bound of every blocking transfer call; a slow or dead peer is dropped after it.",
    )
    backend: Literal["auto", "nccl", "gloo"] = Field(
        "auto", description="dist: process-group backend (auto = nccl with CUDA, else gloo)."
    )
    dist_host: str | None = Field(
        None,
        description="dist: the learner host's address that actors (or relays) reach its rendezvous store and group on; gloo binds it too. None = the address its traffic to the broker leaves from: loopback while the broker is on loopback (the run stays on this host), else routable (if the broker's name resolves to this host's loopback: the default route's address, else any interface's that is up).",
    )
    dist_port: int = Field(
        29600,
        ge=0,
        le=65535,
        description="dist: first TCP port of the learner's rendezvous store (the first free one of `dist_port`..`dist_port + dist_ports - 1` is taken; 0 = any free port). A firewall must let actor hosts reach this range on the learner host, and let the process group's own connections through both ways: gloo and NCCL open them on ephemeral ports, which neither lets you pin (docs/multihost.md).",
    )
    dist_ports: int = Field(
        8,
        ge=1,
        le=1024,
        description="dist: how many ports from `dist_port` on the store may take (runs or learners sharing a host take one each).",
    )
    relay: bool = Field(
        False,
        description="dist: one relay per actor host (`python -m streamrl.weightsync.relay`, started by `streamrl actors`) joins the learner's group and hands each version to its host's actors over shm, so one copy per host crosses the network; the learner's own host's actors read the learner's shm. False = every actor joins the group itself (NCCL straight into its GPU).",
    )
