"""Rollout sources by name: what an actor rolls out, chosen once from the config (``Config.rollout_source``).

- ``prompts``: dataset prompts, G completions each (the default);
- ``environment``: multi-turn trajectories through an environment (``env.name``);
- ``agent``: agent programs' calls through the OpenAI API the actor serves (``agent.enabled``).

A source is one module here holding a ``Source`` subclass with its ``name`` and a
``from_config`` that reads only the config sections it names; listing it in ``SOURCES`` makes it
selectable.
"""

from __future__ import annotations

from streamrl.actors.sources.agent import AgentSource
from streamrl.actors.sources.base import Generation, Source
from streamrl.actors.sources.environment import EnvironmentSource
from streamrl.actors.sources.prompts import PromptsSource

SOURCES: dict[str, type[Source]] = {
    s.name: s for s in (PromptsSource, EnvironmentSource, AgentSource)
}


def get(name: str) -> type[Source]:
    """The source registered as ``name``."""
    return SOURCES[name]


__all__ = ["SOURCES", "Generation", "Source", "get"]
