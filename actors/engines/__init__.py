"""Generation engines by name (``actor.engine``): ``hf`` everywhere, ``vllm`` on GPUs (or its CPU build).

An engine is one module here (or one subpackage: ``vllm``, which holds all of vLLM's weight
loading too) holding an ``Engine`` subclass with its ``name``, its capabilities
(``places_own_threads``) and a ``from_config`` that reads only the config sections it names;
listing it in ``ENGINES`` and in the schema's ``actor.engine`` literal makes it selectable.
Callers look an engine up once and ask its capabilities, never compare its name.
"""

from __future__ import annotations

from streamrl.actors.engines.base import (
    Engine,
    EngineParts,
    Output,
    Request,
    SamplingParams,
    WeightSource,
)
from streamrl.actors.engines.hf import HFEngine
from streamrl.actors.engines.vllm.engine import VLLMEngine
from streamrl.configs.errors import StreamRLError

ENGINES: dict[str, type[Engine]] = {e.name: e for e in (HFEngine, VLLMEngine)}


class UnknownEngine(StreamRLError, ValueError):
    pass


def get(name: str) -> type[Engine]:
    """The engine registered as ``name``."""
    try:
        return ENGINES[name]
    except KeyError:
        raise UnknownEngine(f"no engine {name!r}; known: {', '.join(ENGINES)}") from None


__all__ = [
    "ENGINES",
    "Engine",
    "EngineParts",
    "Output",
    "Request",
    "SamplingParams",
    "UnknownEngine",
    "WeightSource",
    "get",
]
