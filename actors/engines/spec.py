"""What the engine registry knows of an engine without importing it: ``EngineSpec``.

A spec says what the rest of a run must know of its engine: its name, its own settings (the
config section ``actor.<name>``), where it computes and what the launcher must leave to it. The
engine itself (a ``base.Engine``) is imported only in ``from_config``, when an actor builds one:
the registry, and the config schema that composes the engines' options from it, stay cheap to
import (no torch, transformers or vLLM).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Literal

from streamrl.configs.errors import StreamRLError

if TYPE_CHECKING:
    from streamrl.configs.actor import ActorConfig
    from streamrl.configs.section import Section


class EngineUnavailable(StreamRLError, ImportError):
    """What an engine needs is missing from this interpreter (``EngineSpec.check_installed``)."""


class EngineSpec:
    """One engine, registered by ``name`` in ``actors.engines``. A spec also has a classmethod
    ``from_config(parts, *, <sections>)``: the engine, built from ``EngineParts`` and the config
    sections its keyword-only parameters name (the actor passes exactly those)."""

    name: ClassVar[str]
    # what it is, in the config reference's words (``actor.engine``)
    summary: ClassVar[str]
    # the engine's own settings, the config section ``actor.<name>`` (None: it has none)
    options: ClassVar[type[Section] | None]
    # where it computes: "device" = on ``actor.device``; "gpu" = on the host's GPU when it has
    # one, else on the CPU (the publisher sends weights in the dtype the engines compute in)
    computes_on: ClassVar[Literal["device", "gpu"]]
    # it places its own threads on cores (vLLM): the launcher leaves it unpinned
    places_own_threads: ClassVar[bool]

    @classmethod
    def gpus_per_actor(cls, options: Section | None) -> int:
        """The GPUs one actor of this engine takes (``actor.gpus`` hands them out in groups)."""
        return 1

    @classmethod
    def check(cls, actor: ActorConfig) -> None:
        """Raise ``ValueError``, saying why, when ``actor`` cannot run this engine (at config
        load)."""

    @classmethod
    def check_installed(cls) -> None:
        """Raise, naming the install, when what the engine needs is missing from this interpreter."""
