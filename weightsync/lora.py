"""LoRA through peft: wrapping a policy with adapters, and what one version of a LoRA policy publishes.

Shared by the learner (the policy it trains, what it publishes) and the actors (the peft-wrapped
policy the hf engine samples from, the adapter names and shapes a vLLM actor stages, the adapter
folder vLLM loads). ``model.lora.sync`` picks what travels:

- ``merged``: the full weights ``W + (alpha / rank) B A`` under the base model's own parameter
  names (``merged_tensors``), so every engine and transport takes them as it takes full weights;
- ``adapter``: only the adapter tensors, under peft's saved names
  (``base_model.model.<module>.lora_A.weight``, as in an ``adapter_model.safetensors``), so a
  published version is an adapter folder's content as is.

An actor applying adapter version N + 1 replaces version N's A and B; its base weights are never
written, so versions never stack.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from streamrl.configs.schema import LoraConfig

# peft's name for the one adapter a streamrl policy has
ADAPTER = "default"
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
    (one-element placeholders on ``device``, as ``policy.parameter_template``) and the resolved
    adapter config (``all-linear`` spelled out as module names), without loading any weights."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from streamrl.weightsync.policy import model_folder

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
