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

from streamrl.weightsync.transports.base import Transport
from streamrl.weightsync.transports.shm import Shm

if TYPE_CHECKING:
    import redis

    from streamrl.broker.keys import Keys
    from streamrl.configs.weightsync import WeightSyncConfig
    from streamrl.weightsync.layout import Layout
    from streamrl.weightsync.transports.cuda_ipc.device import DeviceIpc
    from streamrl.weightsync.transports.cuda_ipc.receiver import CudaIpcReceiver
    from streamrl.weightsync.transports.cuda_ipc.sender import CudaIpcSender


class CudaIpcTransport(Transport):
    name = "cuda_ipc"
    publishes = True
    shared_memory = False
    device_ipc = True
    background = False
    process_group = False
    relays = False

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

        return CudaIpcSender(self._ops(), keys.run_name, layout, ws.slots, ws.timeout_s, host_id)

    def receiver(
        self, ws: WeightSyncConfig, client: redis.Redis, keys: Keys, actor_id: str
    ) -> CudaIpcReceiver:
        from streamrl.weightsync.transports.cuda_ipc.receiver import CudaIpcReceiver

        return CudaIpcReceiver(self._ops(), ws.timeout_s)

    # the readers copying a slot right now: their leases in the control segment, an shm segment
    describe = Shm.describe


TRANSPORT = CudaIpcTransport()
