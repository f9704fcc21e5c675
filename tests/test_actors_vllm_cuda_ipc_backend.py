"""The ``streamrl_cuda_ipc`` vLLM backend's worker side at the function level, against the real vLLM
(CPU build) with the CUDA calls answered by tests/ipc_standin.py: the CPU build has no CUDA, so
no engine can be started with this backend here; what is tested is what the worker does with an
update info: open the control segment and its slots once per publisher, lease the announced slot,
load its tensors (and aliases) in place, refuse a slot that no longer holds the version.
Skipped where vLLM is not installed (``make test-vllm`` runs it)."""

from __future__ import annotations

import os
import uuid

import pytest
import torch
from ipc_standin import FileIpc

if not os.environ.get("STREAMRL_REQUIRE_VLLM"):
    pytest.importorskip("vllm")

from streamrl.actors.engines.vllm.cuda_ipc_backend import CudaIpcWeightTransferEngine  # noqa: E402
from streamrl.actors.engines.vllm.shm_backend import ShmUpdateInfo, SlotChanged  # noqa: E402
from streamrl.weightsync.layout import Layout, TensorSpec  # noqa: E402
from streamrl.weightsync.transports.cuda_ipc.slots import IpcSlotsWriter  # noqa: E402
from streamrl.weightsync.transports.shm.segment import active_leases  # noqa: E402

LAYOUT = Layout.build(
    [TensorSpec("model.embed.weight", (4, 8), "float32"), TensorSpec("norm", (8,), "float32")]
)


class _Model:
    """What the engine calls on vLLM's model: ``load_weights`` with (name, tensor) pairs."""

    def __init__(self):
        self.loaded: list[tuple[str, torch.Tensor]] = []

    def load_weights(self, weights):
        self.loaded.extend(weights)


def _engine(ops) -> CudaIpcWeightTransferEngine:
    # vLLM's own constructor wants a running engine's configs; the worker-side state is ours
    engine = object.__new__(CudaIpcWeightTransferEngine)
    engine.ops, engine.model, engine.lease_s = ops, _Model(), 5.0
    engine._reader, engine._leased = None, False
    return engine


def _info(writer, slot: int, version: int) -> ShmUpdateInfo:
    return ShmUpdateInfo(
        segment=writer.name,
        slot=slot,
        version=version,
        layout=LAYOUT.to_json(),
        aliases={"lm_head.weight": "model.embed.weight"},
    )


def test_the_worker_loads_the_leased_slot_in_place_and_refuses_a_reused_one(tmp_path):
    ops = FileIpc(tmp_path)
    writer = IpcSlotsWriter(
        ops, f"vllm-{uuid.uuid4().hex[:8]}", LAYOUT, 2, 5.0, torch.device("cpu")
    )
    engine = _engine(ops)
    try:
        tensors = {"model.embed.weight": torch.full((4, 8), 3.0), "norm": torch.ones(8)}
        slot, _ = writer.write(1, tensors)
        engine.receive_weights(_info(writer, slot, 1))
        loaded = dict(engine.model.loaded)
        assert sorted(loaded) == ["lm_head.weight", "model.embed.weight", "norm"]
        assert torch.equal(loaded["lm_head.weight"], tensors["model.embed.weight"])
        # in place: views of the slot as this worker opened it, leased until finish
        assert loaded["norm"].data_ptr() == engine._reader.views(slot, LAYOUT)["norm"].data_ptr()
        assert [r["slot"] for r in active_leases(writer.name)] == [slot]
        reader = engine._reader
        assert engine._release() and active_leases(writer.name) == []
        writer.write(2, tensors)
        slot3, _ = writer.write(3, tensors)
        with pytest.raises(SlotChanged):
            engine.receive_weights(_info(writer, slot3, 1))
        engine.receive_weights(_info(writer, slot3, 3))
        assert engine._reader is reader, "the slots are opened once per publisher"
    finally:
        engine.shutdown()
        writer.close()


def test_the_plugin_registers_both_backends():
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    from streamrl.actors.engines.vllm import plugin

    plugin.register()
    plugin.register()
    loader = WeightTransferEngineFactory._registry[plugin.IPC_BACKEND]
    assert loader() is CudaIpcWeightTransferEngine
