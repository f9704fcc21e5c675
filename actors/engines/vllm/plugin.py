"""vLLM general plug-in: registers the ``streamrl_shm`` and ``streamrl_cuda_ipc`` weight-transfer
backends in every vLLM process.

vLLM spawns its engine core and workers, so a registration made in the actor
process alone is not seen where the weights are loaded; vLLM calls every
``vllm.general_plugins`` entry point (``pyproject.toml``) in each of its
processes, and this is ours. The engine classes live in ``shm_backend`` and
``cuda_ipc_backend`` and are imported lazily by vLLM's factory.
Imports nothing of vLLM at module level.
"""

from __future__ import annotations

SHM_BACKEND = "streamrl_shm"
IPC_BACKEND = "streamrl_cuda_ipc"
# backend -> (module, class) of its worker-side engine
ENGINES = {
    SHM_BACKEND: ("streamrl.actors.engines.vllm.shm_backend", "ShmWeightTransferEngine"),
    IPC_BACKEND: ("streamrl.actors.engines.vllm.cuda_ipc_backend", "CudaIpcWeightTransferEngine"),
}


def register() -> None:
    """Idempotent: vLLM may load general plug-ins more than once per process."""
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    for backend, (module, cls) in ENGINES.items():
        try:
            WeightTransferEngineFactory.register_engine(backend, module, cls)
        except ValueError as exc:
            if "already registered" not in str(exc):
                raise
