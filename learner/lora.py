"""LoRA on the learner (``model.lora``): the policy it trains, the KL term's reference, the export.

With ``model.lora.rank`` > 0 the learner trains a peft-wrapped policy whose adapters alone require
grad (the engine's optimizer, and so ZeRO-2's partitions, hold only them). The frozen initial
policy the KL term compares against is the same model with its adapters disabled (peft initialises
B to zero), not a second copy. An export writes the merged weights as a plain Hugging Face folder
and the adapter as a PEFT folder inside it (``adapter/``).
"""

from __future__ import annotations

import os

import torch

from streamrl.configs.schema import Config, LoraConfig
from streamrl.weightsync.lora import ADAPTER, is_lora_policy, merged_tensors, wrap
from streamrl.weightsync.policy import load_policy

# the PEFT adapter folder inside an exported policy folder
ADAPTER_DIR = "adapter"


def training_policy(model: torch.nn.Module, lora: LoraConfig) -> torch.nn.Module:
    """The module the learner trains: ``model`` itself, or wrapped with fresh adapters."""
    return wrap(model, lora) if lora.enabled else model


def trainable_parameters(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """What the optimizer steps: every parameter, or with LoRA the adapters only."""
    return [p for p in model.parameters() if p.requires_grad]


class AdaptersDisabled:
    """A LoRA policy seen with its adapters off: the initial policy, for the KL term's no-grad pass.

    Stands in for a reference model wherever one is scored (``weightsync.policy.sequence_logprobs``
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


def reference_policy(cfg: Config, model: torch.nn.Module, device: str):
    """The KL term's reference on the learner: None without a learner-side KL pass, the adapters-off
    view of a LoRA policy, else a frozen copy of ``model.path``."""
    if cfg.algo.kl_coef == 0 or cfg.algo.actors_score_reference:
        return None
    if cfg.model.lora.enabled:
        return AdaptersDisabled(model)
    return load_policy(cfg.model.path, cfg.model.dtype, device)


def merged_policy(model):
    """A plain transformers model (on the CPU, in the policy's dtype) holding a LoRA policy's merged
    weights: its base model's architecture, loaded from where the base came from, every parameter
    copied from ``weightsync.lora.merged_tensors``."""
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
