"""The hf engine's KV caches of multi-turn trajectories, kept from one turn to the next.

A session's entry is the keys and values of the tokens its last turn ran through the model
(the prompt and every sampled token but the last, which was never fed back), one ``[heads,
length, head_dim]`` pair per layer. The next turn's prompt extends those tokens (the last
sampled token, then the environment's), so only that suffix needs a forward pass.

An entry holds only keys and values computed under one set of weights: the engine stores a
row's cache only when no swap happened since its prefill, and drops every entry at a swap.
An entry is taken (removed) when its next turn starts, and dropped when its trajectory ends
(``Engine.end_sessions``): at most one per live trajectory.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Saved:
    tokens: tuple[int, ...]
    # per layer, [heads, len(tokens), head_dim]
    keys: list[torch.Tensor]
    values: list[torch.Tensor]


class Sessions:
    def __init__(self) -> None:
        self._saved: dict[str, Saved] = {}

    def __len__(self) -> int:
        return len(self._saved)

    def save(self, session: str, saved: Saved) -> None:
        self._saved[session] = saved

    def take(self, session: str | None, prompt: list[int]) -> Saved | None:
        """The session's entry if ``prompt`` extends its tokens by at least one token; removed
        either way (a prompt that does not extend it is a different history)."""
        saved = self._saved.pop(session, None) if session is not None else None
        if saved is None:
            return None
        n = len(saved.tokens)
        if len(prompt) <= n or tuple(prompt[:n]) != saved.tokens:
            return None
        return saved

    def drop(self, sessions: Iterable[str]) -> None:
        for session in sessions:
            self._saved.pop(session, None)

    def clear(self) -> None:
        self._saved.clear()
