"""The policy learner and actors share (``model``, with its LoRA adapters ``model.lora``)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from streamrl.configs.section import Section


class LoraConfig(Section):
    """LoRA through peft: the learner trains low-rank adapters on the frozen policy (off while rank is 0)."""

    rank: int = Field(
        0,
        ge=0,
        description="Adapter rank r (0 = off: the whole policy is trained). The learner's optimizer and ZeRO-2 then hold only the adapters, and the KL term's reference is the policy with its adapters disabled (no second copy).",
    )
    alpha: float = Field(
        16.0, gt=0, description="LoRA alpha: a layer's update is (alpha / rank) B A."
    )
    dropout: float = Field(
        0.0,
        ge=0,
        lt=1,
        description="Dropout on the adapters' input while training (the actors sample without it, so > 0 makes the learner's pi differ from theirs).",
    )
    target_modules: list[str] | Literal["all-linear"] = Field(
        "all-linear",
        description="Modules that get adapters: peft's `target_modules`, names or name suffixes (e.g. `[q_proj, k_proj, v_proj, o_proj]`), or all-linear (every linear layer but the output head).",
    )
    sync: Literal["merged", "adapter"] = Field(
        "merged",
        description="What the learner publishes per version: merged = the full weights W + (alpha / rank) B A under the base model's names (every engine and transport, the actors never know LoRA is on); adapter = only the adapter tensors (a few % of the bytes): the hf engine swaps them into a peft-wrapped copy of the policy, vLLM loads each version as a new LoRA adapter (requests keep the adapter they started with).",
    )

    @property
    def enabled(self) -> bool:
        return self.rank > 0

    @property
    def adapter_versions(self) -> bool:
        """Whether a published version is the adapters alone (``sync: adapter`` with LoRA on)."""
        return self.enabled and self.sync == "adapter"

    @model_validator(mode="after")
    def _vllm_rank(self) -> LoraConfig:
        if self.rank > 512:
            raise ValueError(f"rank {self.rank}: vLLM serves LoRA ranks up to 512")
        return self


class ModelConfig(Section):
    """The policy checkpoint (a Hugging Face folder or hub id) shared by learner and actors."""

    path: str = Field(
        "",
        description="Required. Hugging Face model folder (config, tokenizer, weights) or hub id `org/name[@revision]` (downloaded into the hub cache; HF_HUB_OFFLINE=1 keeps to the cache), loaded with from_pretrained by learner and actors.",
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="Compute dtype; auto = bfloat16 on GPU, float32 on CPU."
    )
    lora: LoraConfig = Field(
        default_factory=LoraConfig, description="LoRA adapters instead of full training."
    )
    init_kwargs: dict[str, Any] = Field(
        default_factory=dict,
        description="Extra keyword arguments of the policy's from_pretrained on the learner and the hf actors (TRL's model_init_kwargs), e.g. {attn_implementation: sdpa}. trust_remote_code runs the model repository's own code: never on unless set here (true/false). Keys streamrl sets itself are refused: dtype/torch_dtype (model.dtype), device_map (the learner and actors place the model), revision (model.path's @revision).",
    )

    @field_validator("init_kwargs")
    @classmethod
    def _own_keys(cls, kwargs: dict[str, Any]) -> dict[str, Any]:
        taken = {
            "dtype": "model.dtype",
            "torch_dtype": "model.dtype",
            "device_map": "the learner and actors place the model",
            "revision": "model.path's @revision",
        }
        clash = sorted(k for k in kwargs if k in taken)
        if clash:
            raise ValueError(
                "streamrl sets these itself: "
                + ", ".join(f"{k} (set by {taken[k]})" for k in clash)
            )
        if "trust_remote_code" in kwargs and not isinstance(kwargs["trust_remote_code"], bool):
            raise ValueError("trust_remote_code must be true or false")
        return kwargs
