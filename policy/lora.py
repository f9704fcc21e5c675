"""LoRA through peft, everything of it in one place (``model.lora``, docs/lora.md).

The learner trains a peft-wrapped policy whose adapters alone require grad (its optimizer, and
so ZeRO-2's partitions, hold only them); the frozen initial policy a KL term compares against is
the same model with its adapters disabled (peft initialises B to zero), not a second copy; an
export writes the merged weights as a plain Hugging Face folder and the adapter as a PEFT folder
inside it (``adapter/``). The actors sample from the peft-wrapped policy (hf engine) or load each
version as a new vLLM adapter (``AdapterVersions``). ``model.lora.sync`` picks what travels:

- ``merged``: the full weights ``W + (alpha / rank) B A`` under the base model's own parameter
  names (``merged_tensors``), so every engine and transport takes them as it takes full weights;
- ``adapter``: only the adapter tensors, under peft's saved names
  (``base_model.model.<module>.lora_A.weight``, as in an ``adapter_model.safetensors``), so a
  published version is an adapter folder's content as is.

An actor applying adapter version N + 1 replaces version N's A and B; its base weights are never
written, so versions never stack.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import tempfile
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import torch

from streamrl.configs.schema import LoraConfig, ModelConfig
from streamrl.policy.load import load_policy, model_folder

# peft's name for the one adapter a streamrl policy has
ADAPTER = "default"
# the PEFT adapter folder inside an exported policy folder
ADAPTER_DIR = "adapter"
# adapters in one vLLM batch (its max_loras): the newest and the versions whose requests still run
MAX_LORAS = 3
# vLLM serves these ranks (vllm.config.lora.MaxLoRARanks)
VLLM_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def peft_config(lora: LoraConfig):
    """peft's ``LoraConfig`` for ``model.lora``."""
    import peft

    return peft.LoraConfig(
        r=lora.rank,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=lora.target_modules,
        bias="none",
        task_type="CAUSAL_LM",
    )


def wrap(model: torch.nn.Module, lora: LoraConfig):
    """``model`` with fresh adapters (a ``PeftModel``; the layers are injected into ``model`` itself).

    peft initialises B to zero, so the wrapped policy computes what ``model`` did, and only the
    adapters require grad.
    """
    from peft import get_peft_model

    return get_peft_model(model, peft_config(lora))


def is_lora_policy(model: torch.nn.Module) -> bool:
    from peft import PeftModel

    return isinstance(model, PeftModel)


def _lora_layers(base: torch.nn.Module) -> dict[str, torch.nn.Module]:
    from peft.tuners.lora import LoraLayer

    return {name: m for name, m in base.named_modules() if isinstance(m, LoraLayer)}


def merged_tensors(model) -> dict[str, torch.Tensor]:
    """Full weights of a ``PeftModel`` under its base model's parameter names: a wrapped layer's
    ``weight`` is ``W + (alpha / rank) B A`` (peft's ``get_delta_weight``), new tensors; every other
    parameter is the live one. The model is left as it is (nothing is merged into it)."""
    base = model.get_base_model()
    layers = _lora_layers(base)
    adapter_params = {
        id(p)
        for layer in layers.values()
        for name, p in layer.named_parameters()
        if not name.startswith("base_layer.")
    }
    out: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        for name, param in base.named_parameters():
            if id(param) in adapter_params:
                continue
            owner, _, leaf = name.rpartition(".")
            layer_name = owner.removesuffix(".base_layer")
            if owner.endswith(".base_layer") and layer_name in layers:
                tensor = param.detach()
                if leaf == "weight":
                    delta = layers[layer_name].get_delta_weight(ADAPTER)
                    tensor = tensor + delta.to(tensor.dtype)
                out[f"{layer_name}.{leaf}"] = tensor
            else:
                out[name] = param.detach()
    return out


def adapter_tensors(model) -> dict[str, torch.Tensor]:
    """The adapter tensors of a ``PeftModel`` under peft's saved names (the live tensors, detached)."""
    from peft import get_peft_model_state_dict

    return {name: t.detach() for name, t in get_peft_model_state_dict(model).items()}


def published_tensors(model: torch.nn.Module, lora: LoraConfig) -> dict[str, torch.Tensor]:
    """What one version of the learner's policy publishes: its parameters, or with LoRA on the
    merged weights or the adapters (``lora.sync``)."""
    if not lora.enabled:
        return {name: p.detach() for name, p in model.named_parameters()}
    if lora.sync == "adapter":
        return adapter_tensors(model)
    return merged_tensors(model)


def adapter_targets(model) -> dict[str, torch.nn.Parameter]:
    """Actor side: the live adapter parameters of a ``PeftModel`` by published (peft saved) name,
    the tensors a staged adapter version is swapped into."""
    by_storage = {p.data_ptr(): p for p in model.parameters()}
    targets = {}
    for name, tensor in adapter_tensors(model).items():
        param = by_storage.get(tensor.data_ptr())
        if param is None:
            raise ValueError(f"peft state dict entry {name!r} is not a parameter of the model")
        targets[name] = param
    return targets


def adapter_template(
    path: str | os.PathLike, lora: LoraConfig, dtype: torch.dtype, device: str = "cpu"
) -> tuple[dict[str, torch.Tensor], dict]:
    """For engines that hold no transformers model (vLLM): the adapter tensors' names and shapes
    (one-element placeholders on ``device``, as ``policy.load.parameter_template``) and the resolved
    adapter config (``all-linear`` spelled out as module names), without loading any weights."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_folder(path))
    with torch.device("meta"):
        model = wrap(AutoModelForCausalLM.from_config(config), lora)
    template = {
        name: torch.empty((), dtype=dtype, device=device).expand(t.shape)
        for name, t in adapter_tensors(model).items()
    }
    return template, adapter_config(model)


def adapter_config(model) -> dict:
    """The ``adapter_config.json`` content of a ``PeftModel``'s adapter (its resolved config)."""
    config = model.peft_config[ADAPTER].to_dict()
    # sets (a resolved all-linear) are not JSON
    return json.loads(json.dumps(config, default=sorted))


def write_adapter(
    folder: str | os.PathLike, tensors: dict[str, torch.Tensor], config: dict
) -> Path:
    """An adapter folder peft and vLLM load: ``adapter_config.json`` and ``adapter_model.safetensors``."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    save_file(
        {name: t.detach().contiguous().cpu() for name, t in tensors.items()},
        folder / "adapter_model.safetensors",
    )
    (folder / "adapter_config.json").write_text(json.dumps(config, indent=2) + "\n")
    return folder


def vllm_max_rank(rank: int) -> int:
    """The smallest rank vLLM serves that holds ``rank`` (vLLM's ``max_lora_rank``)."""
    return next(r for r in VLLM_RANKS if r >= rank)


def training_policy(model: torch.nn.Module, lora: LoraConfig) -> torch.nn.Module:
    """The module the learner trains: ``model`` itself, or wrapped with fresh adapters."""
    return wrap(model, lora) if lora.enabled else model


def trainable_parameters(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """What the optimizer steps: every parameter, or with LoRA the adapters only."""
    return [p for p in model.parameters() if p.requires_grad]


class AdaptersDisabled:
    """A LoRA policy seen with its adapters off: the initial policy, for the KL term's no-grad pass.

    Stands in for a reference model wherever one is scored (``policy.logprobs.sequence_logprobs``
    takes anything with ``parameters()`` that is called like a causal LM).
    """

    def __init__(self, model) -> None:
        self.model = model

    def __getattr__(self, name: str):
        # everything but the call is the policy's own (parameters, config, output layer)
        return getattr(self.model, name)

    def __call__(self, *args, **kwargs):
        with self.model.disable_adapter():
            return self.model(*args, **kwargs)


def reference_policy(model_cfg: ModelConfig, model: torch.nn.Module, device: str):
    """The KL term's frozen reference next to the policy being trained (``model``): the
    adapters-off view of a LoRA policy, else a copy of ``model.path`` loaded on ``device``."""
    if model_cfg.lora.enabled:
        return AdaptersDisabled(model)
    return load_policy(model_cfg.path, model_cfg.dtype, device, model_cfg.init_kwargs)


def merged_policy(model):
    """A plain transformers model (on the CPU, in the policy's dtype) holding a LoRA policy's merged
    weights: its base model's architecture, loaded from where the base came from, every parameter
    copied from ``merged_tensors``."""
    source = model.peft_config[ADAPTER].base_model_name_or_path
    if not source:
        raise ValueError("the LoRA policy does not name the folder of its base model")
    merged = merged_tensors(model)
    plain = load_policy(source, next(model.parameters()).dtype, "cpu")
    params = dict(plain.named_parameters())
    if params.keys() != merged.keys():
        raise ValueError(
            f"merged LoRA weights do not match {source}'s parameters: "
            f"missing {sorted(params.keys() - merged.keys())[:5]}, extra {sorted(merged.keys() - params.keys())[:5]}"
        )
    with torch.no_grad():
        for name, param in params.items():
            param.copy_(merged[name])
    return plain


def save_export(model, staging: str | os.PathLike) -> None:
    """Write ``model`` into an export's staging folder: a LoRA policy as its merged weights plus its
    PEFT adapter folder (``adapter/``), any other as it is."""
    if not is_lora_policy(model):
        model.save_pretrained(staging, safe_serialization=True)
        return
    merged_policy(model).save_pretrained(staging, safe_serialization=True)
    model.save_pretrained(os.path.join(staging, ADAPTER_DIR), safe_serialization=True)


class AdapterVersions:
    """A vLLM actor's adapter versions (``model.lora.sync: adapter``): each version a new vLLM adapter.

    The actor's subscriber stages a version's adapter tensors (they travel like any weights, over
    ``shm`` or ``dist``); ``load`` writes them as an adapter folder (``write_adapter``) under a
    private (0700) folder and loads it into the running engine with
    ``AsyncLLM.add_lora(LoRARequest(...))`` under a fresh adapter id, without a restart
    (https://docs.vllm.ai/en/latest/features/lora/). New requests name the newest adapter; a
    request in flight keeps the adapter it started with to its end, so every token of a completion
    is tagged with the version that sampled it. An adapter is removed (``remove_lora``, its folder
    deleted) once it is neither the newest nor used by a request, so the engine holds at most the
    versions in flight. vLLM is not imported here: the engine passes its ``LoRARequest`` class and
    its AsyncLLM.
    """

    def __init__(self, config: dict, lora_request: Callable[..., object]) -> None:
        """``config``: the adapter folders' ``adapter_config.json`` (``adapter_template``);
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
