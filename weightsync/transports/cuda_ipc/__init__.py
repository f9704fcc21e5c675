"""The ``cuda_ipc`` transport: GPU actors on the learner's host copy each version device to device
from the learner's GPU.

Not ``background``: the publisher's background path stages each version through pinned host
memory for a thread to write out, which is the copy this transport exists to avoid. Here the
slot on the learner's GPU is the staging buffer: ``send`` runs in ``Publisher.submit``, copies
(converting) the learner's tensors into a free slot on the GPU and waits for that copy and its
checksums (a device-to-device copy: milliseconds), so the learner may change its weights as soon
as ``submit`` returns, and the announcement follows at once.

A receiver copies the announced slot into the subscriber's staging tensors on the actor's device
(the hf engine swaps them in as over shm); vLLM's workers open the slots themselves and load from
them in place (``actors.engines.vllm.cuda_ipc_backend``).

- ``device``: every CUDA call of the transport (``DeviceIpc``; tests put a CPU stand-in in
  ``TRANSPORT.ops``);
- ``slots``: the slots on the GPU and their control segment (an shm segment of another kind:
  ``transports.shm.segment``, with shm's checksums);
- ``sender``, ``receiver``: the transport's two ends.

Imports nothing heavy: the modules above are imported where a sender or receiver is made.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import Field

from streamrl.configs.section import Section
from streamrl.weightsync.transports.base import Transport
from streamrl.weightsync.transports.shm import Shm

if TYPE_CHECKING:
    import redis

    from streamrl.broker.keys import Keys
    from streamrl.configs.actor import ActorConfig
    from streamrl.configs.weightsync import WeightSyncConfig
    from streamrl.weightsync.layout import Layout
    from streamrl.weightsync.transports.cuda_ipc.device import DeviceIpc
    from streamrl.weightsync.transports.cuda_ipc.receiver import CudaIpcReceiver
    from streamrl.weightsync.transports.cuda_ipc.sender import CudaIpcSender


class Options(Section):
    """The ``cuda_ipc`` transport's slots on the learner's GPU (``weightsync.cuda_ipc``)."""

    slots: int = Field(
        3,
        ge=2,
        description="Ring of slots on the learner's GPU, so the publisher never overwrites a slot a reader is copying; costs `slots` copies of the weights in the learner GPU's memory.",
    )


class CudaIpcTransport(Transport):
    name = "cuda_ipc"
    summary = "GPU actors on the learner's host copy each version device to device from slots on the learner's GPU, shared once as CUDA IPC handles (needs CUDA actors on the learner's host, actor.device cuda; with actor.gpus a list each actor also sees the learner's GPU, after its own, and copies from it peer to peer)"
    options = Options
    publishes = True
    shared_memory = False
    device_ipc = True
    background = False

    def __init__(self) -> None:
        # every CUDA call of the transport; None: a ``device.CudaIpc``, made when a sender or
        # receiver is (importing it imports torch). Tests set a stand-in here.
        self.ops: DeviceIpc | None = None

    def _ops(self) -> DeviceIpc:
        if self.ops is None:
            from streamrl.weightsync.transports.cuda_ipc.device import CudaIpc

            self.ops = CudaIpc()
        return self.ops

    def sender(
        self,
        ws: WeightSyncConfig,
        client: redis.Redis,
        keys: Keys,
        layout: Layout,
        *,
        publisher: str = "",
        host_id: str = "",
    ) -> CudaIpcSender:
        from streamrl.weightsync.transports.cuda_ipc.sender import CudaIpcSender

        return CudaIpcSender(
            self._ops(), keys.run_name, layout, ws.cuda_ipc.slots, ws.timeout_s, host_id
        )

    def receiver(
        self, ws: WeightSyncConfig, client: redis.Redis, keys: Keys, actor_id: str
    ) -> CudaIpcReceiver:
        from streamrl.weightsync.transports.cuda_ipc.receiver import CudaIpcReceiver

        return CudaIpcReceiver(self._ops(), ws.timeout_s, keys.run_name)

    def check(self, ws: WeightSyncConfig, actor: ActorConfig) -> None:
        """Every engine that computes on ``actor.device`` must compute on a GPU: the learner's
        slots are opened on a CUDA device (an engine on the host's GPU, vLLM, always is)."""
        on_device = actor.engines_computing_on("device")
        if on_device and not actor.device.startswith("cuda"):
            raise ValueError(
                f"actor.device={actor.device} for the {', '.join(on_device)} engine: "
                f"weightsync.transport={self.name} copies weights from the learner's GPU into GPU "
                "actors on its host; use weightsync.transport=shm for CPU actors"
            )

    # the readers copying a slot right now: their leases in the control segment, an shm segment
    describe = Shm.describe


TRANSPORT = CudaIpcTransport()
