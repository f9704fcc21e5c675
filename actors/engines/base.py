"""The engine interface: prompt token ids in, completions out with per-token log-probs and versions.

Every engine tags each sampled token with the behaviour log-prob under the
distribution it was actually drawn from (after temperature, top-k, top-p) and
the policy version of the weights that produced it; weights may change between
two tokens of one completion.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import numpy as np

from streamrl.actors import metrics

if TYPE_CHECKING:
    from streamrl.weightsync.feed import WeightFeed


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    # 0 = off
    top_k: int = 0
    # EOS ids; the stop token is part of the completion
    stop_token_ids: tuple[int, ...] = ()
    # stop strings, checked on the decoded completion
    stop: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")

    @classmethod
    def from_config(cls, rollout, stop_token_ids: Sequence[int]) -> SamplingParams:
        return cls(
            max_new_tokens=rollout.max_new_tokens,
            temperature=rollout.temperature,
            top_p=rollout.top_p,
            top_k=rollout.top_k,
            stop_token_ids=tuple(stop_token_ids),
            stop=tuple(rollout.stop),
        )


@dataclass
class Request:
    request_id: str
    prompt_token_ids: list[int]
    # a multi-turn trajectory's id: an engine may keep its state (the hf engine its KV cache) from
    # one turn to the next, until ``end_sessions``
    session: str | None = None


@dataclass
class Output:
    request_id: str
    # [T] int32
    token_ids: np.ndarray
    # [T] float32, behaviour log-prob of each sampled token
    logprobs: np.ndarray
    # [T] int32, policy version that sampled each token
    versions: np.ndarray
    # stop | length | abort
    finish_reason: str
    meta: dict = field(default_factory=dict)


class WeightSource(Protocol):
    """What an engine needs from a weightsync subscriber."""

    def take_staged(self) -> tuple[int, dict] | None: ...

    def applied(self, version: int, recycled: dict | None = None) -> None: ...

    def rejected(self, version: int) -> None: ...

    # where the live weights were read from (a shm segment's name; "" before any): what the
    # actor reports, so a test can prove which host's copy it applied
    @property
    def live_source(self) -> str: ...


# after ``refill`` gave nothing it is asked again no sooner than this (it may ask Redis)
REFILL_RETRY_S = 0.02


class RefillPacer:
    """When an engine asks ``refill`` again after it gave nothing: no sooner than REFILL_RETRY_S
    later, unless the engine is idle, when asking is the last chance before its call ends (so a
    call ends because ``refill`` has nothing, never because of the timer)."""

    def __init__(self) -> None:
        self.refused_at = -REFILL_RETRY_S

    def due(self, idle: bool) -> bool:
        return idle or time.monotonic() - self.refused_at >= REFILL_RETRY_S

    def gave(self, requests: Sequence[Request]) -> None:
        if not requests:
            self.refused_at = time.monotonic()


@dataclass(frozen=True)
class EngineParts:
    """What an engine is built with besides its config sections."""

    # the actor's way to the learner's weights (``weightsync.feed``)
    feed: WeightFeed | None
    tokenizer: object
    # the engine's sampling seed (``actors.loop.sampling_seed``)
    seed: int = 0


class Engine(ABC):
    """One generation engine, built by its spec's ``from_config`` (``actors.engines.spec``): it
    takes the weights the way it needs them (a subscriber, or the announcements its workers
    follow) and starts receiving once it stands.
    """

    version: int
    # where the live weights were read (an shm segment's name, naming its host and writer), reported
    # in the actor's heartbeat; "" before any, or where the transport reads no segment
    weights_from: str = ""

    @abstractmethod
    def generate(
        self,
        requests: Sequence[Request],
        params: SamplingParams,
        should_abort: Callable[[], bool] | None = None,
        refill: Callable[[int], Sequence[Request]] | None = None,
        on_finished: Callable[[int, Output], None] | None = None,
    ) -> list[Output]:
        """Complete every request (in request order). ``should_abort`` is polled between steps;
        once it returns True the unfinished requests end with finish reason ``abort``.

        ``refill(room)`` is asked for up to ``room`` more requests while the engine has room for
        them (their outputs follow the given requests'), so finished slots never wait for the
        longest completion; ``on_finished(index, output)`` hears of each request as it stops or reaches
        its length (not on abort). Both are called from the thread that runs ``generate``."""

    @abstractmethod
    def maybe_swap_weights(self) -> None:
        """Bring newer weights into the engine if its weight source has them; otherwise nothing.

        The actor calls it between batches, while the engine is idle, so a version published
        between two batches serves the next one. It never waits for weights: an engine with
        no weight source, or nothing newer, returns at once. After a swap ``version`` is the
        version that samples every new token. It raises when the engine can no longer take
        weights (a dead vLLM engine), so the actor ends and its supervisor restarts it.
        """

    def end_sessions(self, sessions: Iterable[str]) -> None:  # noqa: B027 - vLLM keeps none
        """Drop what the engine kept for these sessions (their trajectories ended)."""

    def _serve(self, version: int) -> None:
        """Record that the weights of ``version`` now sample every new token."""
        self.version = version
        metrics.POLICY_VERSION.set(version)

    def close(self) -> None:  # noqa: B027 - engines without resources need nothing here
        """Release the engine's resources."""
