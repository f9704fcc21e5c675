"""The worker side of the ``streamrl_cuda_ipc`` vLLM weight-transfer backend (imports vLLM; runs in
its workers, on a GPU).

The ``streamrl_shm`` engine (``shm_backend``) with the learner's GPU slots in place of shared
memory: each worker opens the announced control segment and its slots' CUDA IPC handles once per
publisher (``weightsync.transports.cuda_ipc.slots.IpcSlotsReader``, cached until the segment
changes), leases the announced slot and ``model.load_weights`` straight from its views on the
learner's GPU: no staging copy in the actor, one device-to-device (or peer) copy into the
engine's weights. The update info is the shm backend's (segment, slot, version, layout, aliases).
"""

from __future__ import annotations

from streamrl.actors.engines.vllm.shm_backend import ShmWeightTransferEngine
from streamrl.weightsync.transports.cuda_ipc.device import CudaIpc, DeviceIpc
from streamrl.weightsync.transports.cuda_ipc.slots import IpcSlotsReader


class CudaIpcWeightTransferEngine(ShmWeightTransferEngine):
    # every CUDA call of the slots (tests/ swap in a stand-in)
    ops: DeviceIpc = CudaIpc()

    def _new_reader(self, segment: str) -> IpcSlotsReader:
        return IpcSlotsReader(self.ops, segment, self.lease_s)
