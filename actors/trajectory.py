"""Multi-turn rollouts, token in and token out: model turns and environment steps, kept as token ids.

A trajectory is its prompt's token ids followed by one growing token list: each model turn's
sampled tokens exactly as the engine returned them (with behaviour log-probs and per-token
versions), then the environment's observation rendered by the chat template and appended as
tokens. Model tokens are never decoded and re-encoded; the text the environment and the
rewards see is decoded from them, but the training sequence is the token list itself. The loss
mask is 1 at the model's tokens and 0 at the environment's.

Each turn asks the engine to continue from the whole token sequence so far, as a request of
the trajectory's session: the hf engine continues from the KV cache it kept for the session,
vLLM finds the sequence in its prefix cache (docs/multiturn.md). A session ends with its
trajectory. The engine tags every token with the version that sampled it, so a weight swap
between turns is tagged per token as inside a turn.

Rendering an observation: the chat template renders a probe conversation (a user turn, then an
assistant turn) with and without the observation; the observation's text is what the longer
rendering adds, preceded by what the template closes an assistant turn with (less the stop token
the model already sampled). Only that text is tokenized.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from streamrl.actors import environment, metrics
from streamrl.actors.engines.base import Output
from streamrl.broker import env_stats

log = logging.getLogger(__name__)

_PROBE = "streamrl probe turn"


def assistant_turn(tokenizer, output: Output) -> dict:
    """The completion as rewards and environments see it (``actors.rewards``): clean text and raw text."""
    ids = output.token_ids.tolist()
    return {
        "role": "assistant",
        "content": tokenizer.decode(ids, skip_special_tokens=True),
        # a sampled pad or chat token is part of what the model wrote; a verifier may need to see it
        "raw_content": tokenizer.decode(ids, skip_special_tokens=False),
        "finish_reason": output.finish_reason,
    }


class RenderError(ValueError):
    """The tokenizer's chat template cannot render an observation as an appendable suffix."""


class Renderer:
    """Token ids of a trajectory's first messages and of each observation, through the chat template."""

    def __init__(
        self,
        tokenizer,
        tools: Sequence[Callable] = (),
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise RenderError("multi-turn environments need a tokenizer with a chat template")
        self.tokenizer = tokenizer
        self.tools = list(tools) or None
        # rollout.chat_template_kwargs
        self.template_kwargs = dict(template_kwargs or {})
        base = [{"role": "user", "content": "u"}, {"role": "assistant", "content": _PROBE}]
        self._base = self._text(base, generation_prompt=False)
        if _PROBE not in self._base:
            raise RenderError("the chat template does not render an assistant turn's content")
        # what the template writes after an assistant turn's content (e.g. "<|im_end|>\n")
        self.closing = self._base[self._base.rindex(_PROBE) + len(_PROBE) :]
        self._probe = base

    def _text(self, messages: list[dict], generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(
            messages,
            tools=self.tools,
            tokenize=False,
            add_generation_prompt=generation_prompt,
            **self.template_kwargs,
        )

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def prompt(self, messages: list[dict]) -> list[int]:
        return self._encode(self._text(messages, generation_prompt=True))

    def observation(self, messages: list[dict], last_token: int, stopped: bool) -> list[int]:
        """The tokens that follow a model turn ending in ``last_token`` (``stopped``: a stop token
        ended it) to present ``messages`` and open the next assistant turn."""
        full = self._text(self._probe + messages, generation_prompt=True)
        if not full.startswith(self._base):
            raise RenderError(
                "the chat template renders earlier turns differently after an observation"
            )
        closing = self.closing
        if stopped:
            stop_text = self.tokenizer.decode([last_token], skip_special_tokens=False)
            if stop_text and closing.startswith(stop_text):
                closing = closing[len(stop_text) :]
        return self._encode(closing + full[len(self._base) :])


@dataclass
class Trajectory:
    env: object
    prompt: list[int]
    # the conversation as text (first messages, then assistant turns and observations)
    messages: list[dict]
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    env_rewards: list[float] = field(default_factory=list)
    turns: int = 0
    # one of environment.END_REASONS once ended
    end: str | None = None
    # the engine session of its turns (Request.session)
    session: str = field(default_factory=lambda: uuid.uuid4().hex)
    # environment step calls and their seconds; tool calls and failures by reason (env_stats)
    steps: int = 0
    step_s: float = 0.0
    tool_calls: int = 0
    tool_failed: dict[str, int] = field(default_factory=dict)

    def add_model_turn(self, output: Output) -> None:
        self.tokens += output.token_ids.tolist()
        self.logprobs += output.logprobs.tolist()
        self.versions += output.versions.tolist()
        self.mask += [1] * len(output.token_ids)
        self.turns += 1

    def add_environment(self, ids: list[int]) -> None:
        # the environment's tokens carry the version of the model token before them, so versions
        # stay non-decreasing; they are never trained (mask 0), and their log-prob is a placeholder
        self.tokens += ids
        self.logprobs += [0.0] * len(ids)
        self.versions += [self.versions[-1]] * len(ids)
        self.mask += [0] * len(ids)

    def tool_failure(self, reason: str) -> None:
        self.tool_failed[reason] = self.tool_failed.get(reason, 0) + 1
        metrics.ENV_TOOL_FAILURES.labels(reason=reason).inc()

    @property
    def truncated(self) -> bool:
        return self.end in environment.TRUNCATED

    def output(self, request_id: str) -> Output:
        """The trajectory after its prompt as one engine ``Output`` (``meta['loss_mask']``);
        finish reason ``stop`` when the environment said done, ``length`` when truncated."""
        return Output(
            request_id=request_id,
            token_ids=np.asarray(self.tokens, dtype=np.int32),
            logprobs=np.asarray(self.logprobs, dtype=np.float32),
            versions=np.asarray(self.versions, dtype=np.int32),
            finish_reason="stop" if self.end == "done" else "length",
            meta={
                "loss_mask": np.asarray(self.mask, dtype=np.uint8),
                "turns": self.turns,
                "end": self.end,
            },
        )


def group_stats(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """A group's ``env`` map for the wire (broker.env_stats): its trajectories' counts summed."""
    stats: dict[str, float] = {
        "turns": sum(t.turns for t in trajectories),
        "steps": sum(t.steps for t in trajectories),
        "step_s": sum(t.step_s for t in trajectories),
        "tool_calls": sum(t.tool_calls for t in trajectories),
    }
    for t in trajectories:
        for reason, n in t.tool_failed.items():
            key = env_stats.TOOL_FAILED + reason
            stats[key] = stats.get(key, 0) + n
        key = env_stats.END + str(t.end)
        stats[key] = stats.get(key, 0) + 1
    return stats
