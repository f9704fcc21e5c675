"""vLLM general plug-in: registers the ``streamrl_shm`` weight-transfer backend in every vLLM process.

vLLM spawns its engine core and workers, so a registration made in the actor
process alone is not seen where the weights are loaded; vLLM calls every
``vllm.general_plugins`` entry point (``pyproject.toml``) in each of its
processes, and this is ours. The engine class itself lives in
``weightsync.vllm_shm_engine`` and is imported lazily by vLLM's factory.
Imports nothing of vLLM at module level.
"""

from __future__ import annotations

BACKEND = "streamrl_shm"


def register() -> None:
    """Idempotent: vLLM may load general plug-ins more than once per process."""
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    try:
        WeightTransferEngineFactory.register_engine(
            BACKEND, "streamrl.weightsync.vllm_shm_engine", "ShmWeightTransferEngine"
        )
    except ValueError as exc:
        if "already registered" not in str(exc):
            raise
