"""Generation engines by name (``actor.engine``): ``hf`` everywhere, ``vllm`` on GPUs (or its CPU build).

An engine is one subpackage here whose ``__init__`` declares it to the registry: an
``EngineSpec`` subclass (``spec``) with its ``name``, its ``options`` (the config section
``actor.<name>``, which the config schema composes from this registry), its capabilities and a
``from_config`` that builds the engine (a ``base.Engine``) from only the config sections it
names. Listing the spec in ``ENGINES`` makes the engine selectable. Callers look an engine up
once and ask its spec, never compare its name.

Importing this is cheap (no torch, transformers or vLLM): each engine is imported where it is
built.
"""

from __future__ import annotations

from streamrl.actors.engines.hf import HF
from streamrl.actors.engines.spec import EngineSpec
from streamrl.actors.engines.vllm import VLLM
from streamrl.configs.errors import StreamRLError

ENGINES: dict[str, type[EngineSpec]] = {e.name: e for e in (HF, VLLM)}


class UnknownEngine(StreamRLError, ValueError):
    pass


def get(name: str) -> type[EngineSpec]:
    """The engine registered as ``name``."""
    try:
        return ENGINES[name]
    except KeyError:
        raise UnknownEngine(f"no engine {name!r}; known: {', '.join(ENGINES)}") from None


__all__ = ["ENGINES", "EngineSpec", "UnknownEngine", "get"]
