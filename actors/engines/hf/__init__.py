"""The ``hf`` engine: a transformers model with a hand-written batched decode loop, on any device.

- ``engine``: ``HFEngine``, the decode loop over a shared KV cache (refill, sessions, per-token
  versions, weight swaps between two decode steps);
- ``prefill``: prompts into the cache, each length batched alone; ``kv_sessions``: the caches a
  multi-turn trajectory keeps between its turns;
- ``static_decode``, ``decode_runners``: on a GPU, fixed KV rows per slot and each decode step
  replayed as a CUDA graph; ``static_support``: whether the installed transformers can carry
  them (if not, the dynamic batch, with the reason logged);
- ``sampling``: temperature, top-k and top-p sampling with the behaviour log-probs.

This module is the engine's declaration for the registry (``HF``, its ``Options``) and how one is
built from the config (``HF.from_config``, ``decode_mode``): the engine itself takes plain values
and knows no config. It imports nothing heavy; the engine is imported where one is built.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field, field_validator

from streamrl.actors.engines.spec import EngineSpec
from streamrl.configs.section import Section

if TYPE_CHECKING:
    from streamrl.actors.engines.base import EngineParts
    from streamrl.actors.engines.hf.engine import HFEngine
    from streamrl.configs.actor import ActorConfig
    from streamrl.configs.model import ModelConfig


class Options(Section):
    """The hf engine's decode (``actor.hf``)."""

    cuda_graphs: Literal["auto", "on", "off"] = Field(
        "auto",
        description="Decode on CUDA: on = a static KV cache per slot and each decode step replayed as a CUDA graph captured per batch-size bucket (powers of two up to actor.batch_slots), weights copied into the parameters in place; off = the dynamic cache (each step launched from Python); auto = on when actor.device is CUDA, off on CPU. on with a CPU actor.device is refused.",
    )

    @field_validator("cuda_graphs", mode="before")
    @classmethod
    def _yaml_on_off(cls, value):
        # YAML reads a bare on / off as a boolean
        return {True: "on", False: "off"}.get(value, value) if isinstance(value, bool) else value


class HF(EngineSpec):
    name = "hf"
    summary = "hf (transformers, any device)"
    options = Options
    computes_on = "device"
    places_own_threads = False

    @classmethod
    def check(cls, actor: ActorConfig) -> None:
        if actor.hf.cuda_graphs == "on" and not actor.device.startswith("cuda"):
            raise ValueError(
                f"actor.hf.cuda_graphs=on needs a CUDA actor.device (CUDA graphs), not {actor.device!r}: use auto or off"
            )

    @classmethod
    def from_config(cls, parts: EngineParts, *, model: ModelConfig, actor: ActorConfig) -> HFEngine:
        """The policy of ``model.path`` on ``actor.device``; with adapter versions
        (``model.lora.sync: adapter``) wrapped with peft, each version swapped into its adapters."""
        from streamrl.actors.engines.hf.engine import HFEngine
        from streamrl.policy.load import load_policy, parameter_template, resolve_dtype
        from streamrl.policy.lora import adapter_targets, adapter_template, wrap

        policy = load_policy(model.path, model.dtype, actor.device, model.init_kwargs)
        targets = None
        if model.lora.adapter_versions:
            dtype = resolve_dtype(model.dtype, actor.device)
            template = adapter_template(model.path, model.lora, dtype, actor.device)[0]
            # peft injects the adapters into ``policy`` itself, which the engine keeps calling
            targets = adapter_targets(wrap(policy, model.lora))
        else:
            template = parameter_template(model.path, model.dtype, actor.device)
        subscriber = parts.feed.subscriber(template) if parts.feed is not None else None
        engine = HFEngine(
            policy,
            parts.tokenizer,
            actor.batch_slots,
            weight_source=subscriber,
            seed=parts.seed,
            weight_targets=targets,
            decode=decode_mode(actor),
        )
        if subscriber is not None:
            engine.owned = subscriber.start()
        return engine


def decode_mode(actor: ActorConfig) -> str:
    """``actor.hf.cuda_graphs`` on ``actor.device``: auto = graphs on CUDA; off = the dynamic batch."""
    import torch

    on_cuda = torch.device(actor.device).type == "cuda"
    graphs = actor.hf.cuda_graphs
    if graphs == "on" or (graphs == "auto" and on_cuda):
        return "graphs"
    return "dynamic"
