"""The worker side of the ``streamrl_shm`` vLLM weight-transfer backend (imports vLLM; runs in its workers).

Each vLLM worker maps the learner publisher's shared-memory segment
(``weightsync.transports.shm``) and loads the announced slot straight from it with
``model.load_weights``, inside vLLM's layerwise reload: no staging copy in the
actor, no CUDA IPC, the same on CPU and GPU (one host). The update info is
tiny (segment name, slot, version, layout, aliases), so one ``update_weights``
call moves a whole version.

The slot stays leased from ``update_weights`` until ``finish_weight_update``:
the layerwise reload keeps references to the loaded tensors of layers it has
not processed yet (the padded vocabulary embedding, attention layers) and
copies them only when it finalises. ``finish`` checks that no writer touched
the slot meanwhile.

Two things vLLM 0.32's reload does not do, done here:

- An aborted update (``update_weights`` raised after ``start_weight_update``)
  leaves layers on ``meta`` with the failed version's tensors buffered; a
  second ``start`` would mix them into the next push. ``start`` drops them,
  so the next full push rebuilds every layer from it alone.
- On the CPU build a layer's GEMM runs on a packed copy of its weight made when
  it is processed. A tied LM head is never loaded (its weight is the
  embedding's), so its packed copy would keep the old embedding while the
  input embedding updates; ``finish`` repacks every layer whose weight is
  shared with another.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from vllm.distributed.weight_transfer.base import (
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)
from vllm.model_executor.model_loader.reload import (
    finalize_layerwise_reload,
    initialize_layerwise_reload,
)
from vllm.model_executor.model_loader.reload.layerwise import LAYERWISE_INFO

from streamrl.configs.errors import StreamRLError
from streamrl.weightsync.layout import Layout
from streamrl.weightsync.transports.shm.slots import ShmReader


@dataclass
class ShmInitInfo(WeightTransferInitInfo):
    lease_s: float = 30.0


@dataclass
class ShmUpdateInfo(WeightTransferUpdateInfo):
    segment: str
    slot: int
    version: int
    layout: list
    aliases: dict[str, str] = field(default_factory=dict)


class SlotChanged(StreamRLError, RuntimeError):
    """The announced slot no longer holds the version (the publisher reused it)."""


class ShmWeightTransferEngine(WeightTransferEngine[ShmInitInfo, ShmUpdateInfo]):
    init_info_cls = ShmInitInfo
    update_info_cls = ShmUpdateInfo
    supports_draft_weight_update = False

    def __init__(self, config, vllm_config, device: torch.device, model: torch.nn.Module) -> None:
        super().__init__(config, vllm_config, device, model)
        self.lease_s = ShmInitInfo.lease_s
        self._reader: ShmReader | None = None
        self._leased = False

    def init_transfer_engine(self, init_info: ShmInitInfo) -> None:
        self.lease_s = init_info.lease_s

    def start_weight_update(self) -> None:
        self._release()
        drop_aborted_loads(self.model)
        initialize_layerwise_reload(self.model)

    def receive_weights(self, update_info: ShmUpdateInfo) -> None:
        layout = Layout.from_json(update_info.layout)
        reader = self._open(update_info.segment)
        self._release()
        views = reader.lease(update_info.version, update_info.slot, layout)
        if views is None:
            raise SlotChanged(
                f"slot {update_info.slot} of {update_info.segment} no longer holds version {update_info.version}"
            )
        self._leased = True
        weights: list[tuple[str, Any]] = list(views.items())
        weights += [(alias, views[source]) for alias, source in update_info.aliases.items()]
        from vllm.model_executor.model_loader.mtp_validation import (
            disable_mtp_completeness_check,
        )

        with disable_mtp_completeness_check():
            self.model.load_weights(weights)
        reader.renew()

    def finish_weight_update(self) -> None:
        try:
            finalize_layerwise_reload(self.model, self.model_config)
            repack_shared_cpu_weights(self.model)
        finally:
            intact = self._release()
        if not intact:
            raise SlotChanged("the publisher reused the slot while it was being loaded")

    def shutdown(self) -> None:
        self._release()
        if self._reader is not None:
            self._reader.close()
            self._reader = None

    def _open(self, segment: str) -> ShmReader:
        if self._reader is None or self._reader.name != segment:
            if self._reader is not None:
                self._release()
                self._reader.close()
            self._reader = self._new_reader(segment)
        return self._reader

    def _new_reader(self, segment: str) -> ShmReader:
        """The reader of ``segment`` whose ``lease`` gives the slot's tensors in place."""
        return ShmReader(segment, self.lease_s)

    def _release(self) -> bool:
        if not self._leased or self._reader is None:
            return True
        self._leased = False
        return self._reader.release()


def drop_aborted_loads(model: torch.nn.Module) -> None:
    """Forget what an aborted update buffered: layers it left waiting keep waiting, with nothing loaded."""
    for layer in model.modules():
        info = LAYERWISE_INFO.get(layer)
        if info is not None and info.can_load():
            info.loaded_weights.clear()
            info.load_numel = 0


def repack_shared_cpu_weights(model: torch.nn.Module) -> list[str]:
    """Re-run weight processing for CPU-packed layers whose weight another layer shares (a tied LM head).

    Returns the names of the layers repacked (empty off the CPU build, where
    layers compute on their weight tensor itself).
    """
    owners: dict[int, list[tuple[str, torch.nn.Module]]] = {}
    for name, module in model.named_modules():
        weight = module._parameters.get("weight")
        if weight is not None and not weight.is_meta and weight.numel() > 0:
            owners.setdefault(weight.data_ptr(), []).append((name, module))
    repacked = []
    for modules in owners.values():
        if len(modules) < 2:
            continue
        for name, module in modules:
            method = getattr(module, "quant_method", None)
            if hasattr(module, "cpu_linear") and method is not None:
                method.process_weights_after_loading(module)
                repacked.append(name)
    return repacked
