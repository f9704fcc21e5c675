"""A vLLM actor's LoRA adapter versions (``model.lora.sync: adapter``): each version a new vLLM adapter.

The actor's subscriber stages a version's adapter tensors (they travel like any weights, over
``shm`` or ``dist``); ``AdapterVersions.load`` writes them as an adapter folder
(``weightsync.lora.write_adapter``) under a private (0700) folder and loads it into the running
engine with ``AsyncLLM.add_lora(LoRARequest(...))`` under a fresh adapter id, without a restart
(https://docs.vllm.ai/en/latest/features/lora/). New requests name the newest adapter; a request in
flight keeps the adapter it started with to its end, so every token of a completion is tagged with
the version that sampled it. An adapter is removed (``remove_lora``, its folder deleted) once it is
neither the newest nor used by a request, so the engine holds at most the versions in flight.

vLLM is not imported here: the engine passes its ``LoRARequest`` class and its AsyncLLM.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import torch

from streamrl.weightsync.lora import write_adapter

# adapters in one batch (vLLM's max_loras): the newest and the versions whose requests still run
MAX_LORAS = 3


class AdapterVersions:
    def __init__(self, config: dict, lora_request: Callable[..., object]) -> None:
        """``config``: the adapter folders' ``adapter_config.json`` (``weightsync.lora.adapter_template``);
        ``lora_request``: vLLM's ``LoRARequest``."""
        self.config = config
        self._lora_request = lora_request
        # made with the first version, so an actor stopped while its engine starts leaves nothing
        self.root: Path | None = None
        self._next_id = 1
        # (version, LoRARequest) new requests use; None = the base model (version 0)
        self.current: tuple[int, object] | None = None
        self._folders: dict[int, Path] = {}
        self._users: Counter[int] = Counter()

    async def load(self, llm, version: int, tensors: dict[str, torch.Tensor]) -> None:
        """Make ``version`` the adapter of new requests; raises (nothing changed) when vLLM refuses it."""
        if self.root is None:
            self.root = Path(tempfile.mkdtemp(prefix="streamrl-lora-"))
        lora_id = self._next_id
        self._next_id += 1
        folder = self.root / f"{lora_id}-v{version}"
        await asyncio.to_thread(write_adapter, folder, tensors, self.config)
        request = self._lora_request(
            lora_name=f"streamrl-v{version}-{lora_id}", lora_int_id=lora_id, lora_path=str(folder)
        )
        try:
            if not await llm.add_lora(request):
                raise RuntimeError(f"vLLM did not load the adapter of version {version}")
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        self._folders[lora_id] = folder
        self.current = (version, request)

    def acquire(self) -> tuple[int, object] | None:
        """(version, LoRARequest) for a new request, held until ``release``; None = the base model."""
        if self.current is not None:
            self._users[self.current[1].lora_int_id] += 1
        return self.current

    def release(self, held: tuple[int, object] | None) -> None:
        if held is not None:
            self._users[held[1].lora_int_id] -= 1

    async def drop_unused(self, llm) -> None:
        """Remove every adapter that is neither the newest nor used by a request in flight."""
        newest = self.current[1].lora_int_id if self.current is not None else None
        for lora_id in [i for i in self._folders if i != newest and self._users[i] <= 0]:
            await llm.remove_lora(lora_id)
            shutil.rmtree(self._folders.pop(lora_id), ignore_errors=True)
            del self._users[lora_id]

    @property
    def loaded(self) -> list[int]:
        """Adapter ids this engine holds (the newest and those of requests in flight)."""
        return sorted(self._folders)

    def close(self) -> None:
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)
