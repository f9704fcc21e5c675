"""Agent trajectories recorded token in, token out from OpenAI-API calls (docs/multiturn.md).

A group is G trajectories on one task (one dataset row). Each trajectory is one agent run: its
calls to ``chat/completions`` (or ``completions``) must each extend the conversation recorded so
far: the earlier messages as sent, the assistant messages exactly as returned, then new messages.
The recorded tokens are the engine's sampled ids (mask 1) and the chat-template rendering of the
new messages only (mask 0, through ``trajectory.Renderer.observation``); the model's tokens are
never decoded and re-encoded. A call that does not extend the recording is refused
(``Diverged``) rather than retokenized.

A call is planned (``chat``/``completion``: the token ids to generate from, nothing changed yet)
and recorded after the engine answered (``record``), so a failed or aborted generation leaves
the trajectory as it was.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from streamrl.actors import environment
from streamrl.actors.engines.base import Output
from streamrl.actors.trajectory import Renderer, RenderError, Trajectory, assistant_turn


class BadCall(ValueError):
    """The request is malformed for this trajectory (HTTP 400)."""


class Diverged(ValueError):
    """The request's conversation does not extend the recorded one (HTTP 409)."""


class Closed(ValueError):
    """The trajectory is closed or has a call in flight (HTTP 409)."""


@dataclass
class Plan:
    """What a call adds before the engine's tokens, and the sequence the engine continues."""

    input_ids: list[int]
    # the first call's prompt, else None
    prompt: list[int] | None
    # the agent's new tokens after the recording (mask 0)
    added: list[int]
    # chat: the conversation after the call's messages; completions: the text after its prompt
    messages: list[dict] | None = None
    text: str | None = None
    # how many tokens the engine may generate
    budget: int = 0


@dataclass
class AgentTrajectory:
    id: str
    group: AgentGroup
    # "chat" or "completions", fixed by the first call
    kind: str | None = None
    renderer: Renderer | None = None
    tools: list | None = None
    record: Trajectory | None = None
    # completions: the text so far (prompts and returned texts), and the first prompt's
    text: str = ""
    prompt_text: str = ""
    # the last model turn as the reward functions see it (content, raw_content, finish_reason)
    last_turn: dict | None = None
    stopped: bool = False
    busy: bool = False
    closed: bool = False
    reward: float | None = None

    @property
    def calls(self) -> int:
        return 0 if self.record is None else self.record.turns


@dataclass
class AgentGroup:
    id: str
    # the admission lease and dataset row (``actors.group.Group``)
    pending: object
    opened_at: float
    trajectories: list[AgentTrajectory] = field(default_factory=list)
    # the last close handed the group to the actor (a racing close must not hand it again)
    handed_over: bool = False

    @property
    def complete(self) -> bool:
        return all(t.closed for t in self.trajectories)


def _text_content(content, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not (isinstance(part, dict) and part.get("type") == "text"):
                raise BadCall(f"{where}: only text content parts are supported")
            if not isinstance(part.get("text"), str):
                raise BadCall(f"{where}: a text part needs a string `text`")
            parts.append(part["text"])
        return "".join(parts)
    raise BadCall(f"{where}: content must be a string, a list of text parts or null")


def _tool_call(call, where: str) -> dict:
    fn = call.get("function") if isinstance(call, dict) else None
    if not (
        isinstance(fn, dict)
        and isinstance(fn.get("name"), str)
        and isinstance(fn.get("arguments"), str)
    ):
        raise BadCall(
            f"{where}: a tool call is {{id, type: function, function: {{name, arguments}}}}"
        )
    return {
        "id": str(call.get("id", "")),
        "type": "function",
        "function": {"name": fn["name"], "arguments": fn["arguments"]},
    }


def normalize(message, where: str) -> dict:
    """An OpenAI chat message as the recorder compares and renders it: role, text content, and
    name, tool_call_id and tool_calls where given (the client's nulls and absences are equal)."""
    if not isinstance(message, dict) or message.get("role") not in environment.ROLES:
        raise BadCall(f"{where}: expected {{role: {'|'.join(environment.ROLES)}, content}}")
    out = {"role": message["role"], "content": _text_content(message.get("content"), where)}
    for key in ("name", "tool_call_id"):
        if message.get(key) is not None:
            if not isinstance(message[key], str):
                raise BadCall(f"{where}: {key} must be a string")
            out[key] = message[key]
    calls = message.get("tool_calls")
    if calls:
        if not isinstance(calls, list):
            raise BadCall(f"{where}: tool_calls must be a list")
        out["tool_calls"] = [_tool_call(c, where) for c in calls]
    return out


def _messages(messages) -> list[dict]:
    if not isinstance(messages, list) or not messages:
        raise BadCall("messages: expected a non-empty list")
    return [normalize(m, f"messages[{i}]") for i, m in enumerate(messages)]


def _tools(tools) -> list | None:
    if tools is None:
        return None
    if not isinstance(tools, list) or not all(
        isinstance(t, dict)
        and t.get("type") == "function"
        and isinstance(t.get("function"), dict)
        and isinstance(t["function"].get("name"), str)
        for t in tools
    ):
        raise BadCall("tools: expected a list of {type: function, function: {name, ...}}")
    return tools or None


def assistant_message(tokenizer, output: Output, tools: list | None) -> dict:
    """The assistant message a chat call returns: the decoded text, and with ``tools`` given the
    turn's Qwen/Hermes ``<tool_call>`` blocks as OpenAI ``tool_calls`` (their text removed)."""
    ids = output.token_ids.tolist()
    content = tokenizer.decode(ids, skip_special_tokens=True)
    message: dict = {"role": "assistant", "content": content}
    if tools:
        raw = tokenizer.decode(ids, skip_special_tokens=False)
        calls = [c for c in environment.parse_tool_calls(raw) if "error" not in c]
        if calls:
            message["content"] = environment.strip_tool_calls(content).strip() or None
            message["tool_calls"] = [
                {
                    "id": f"call_{uuid.uuid4().hex[:12]}",
                    "type": "function",
                    "function": {"name": c["name"], "arguments": json.dumps(c["arguments"])},
                }
                for c in calls
            ]
    return message


class Recorder:
    """The open groups and trajectories of one actor, and the token bookkeeping of their calls."""

    def __init__(
        self,
        tokenizer,
        group_size: int,
        max_total_tokens: int,
        max_positions: int,
        max_prompt_tokens: int,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        # rollout.chat_template_kwargs
        self.template_kwargs = dict(template_kwargs or {})
        self.group_size = group_size
        self.max_total_tokens = max_total_tokens
        self.max_prompt_tokens = max_prompt_tokens
        self.max_positions = max_positions
        self.vocab = len(tokenizer)
        self.groups: dict[str, AgentGroup] = {}
        self.trajectories: dict[str, AgentTrajectory] = {}

    def open_group(self, pending) -> AgentGroup:
        group = AgentGroup(uuid.uuid4().hex, pending, time.monotonic())
        for _ in range(self.group_size):
            t = AgentTrajectory(uuid.uuid4().hex, group)
            group.trajectories.append(t)
            self.trajectories[t.id] = t
        self.groups[group.id] = group
        return group

    def forget(self, group: AgentGroup) -> None:
        self.groups.pop(group.id, None)
        for t in group.trajectories:
            self.trajectories.pop(t.id, None)

    def expired(self, timeout_s: float) -> list[AgentGroup]:
        now = time.monotonic()
        return [g for g in self.groups.values() if now - g.opened_at > timeout_s]

    def get(self, trajectory_id: str) -> AgentTrajectory:
        """KeyError for an unknown (or dropped) trajectory; Closed for a closed or busy one."""
        t = self.trajectories[trajectory_id]
        if t.closed:
            raise Closed(f"trajectory {trajectory_id} is closed")
        if t.busy:
            raise Closed(f"trajectory {trajectory_id} has a call in flight; calls are sequential")
        return t

    # -- planning a call -------------------------------------------------------------------------

    def chat(self, t: AgentTrajectory, messages, tools, max_tokens: int) -> Plan:
        messages = _messages(messages)
        tools = _tools(tools)
        if t.kind is None:
            try:
                renderer = Renderer(self.tokenizer, tools or (), self.template_kwargs)
                prompt = renderer.prompt(messages)
            except RenderError as exc:
                raise BadCall(str(exc)) from None
            # the chat template's own complaint about these messages
            except Exception as exc:
                raise BadCall(f"messages: the chat template cannot render them: {exc}") from None
            t.renderer, t.tools = renderer, tools
            return self._plan(t, prompt, [], max_tokens, messages=messages)
        if t.kind != "chat":
            raise Diverged(
                "this trajectory is recorded through /completions, not /chat/completions"
            )
        if tools != t.tools:
            raise Diverged("tools differ from the trajectory's first call")
        recorded = t.record.messages
        if len(messages) <= len(recorded):
            raise Diverged(
                f"the conversation has {len(messages)} messages, the recording {len(recorded)}: "
                "a call must add messages after the last assistant turn (a fresh sample of the "
                "same turn is another trajectory)"
            )
        for i, (sent, kept) in enumerate(zip(messages, recorded, strict=False)):
            if sent != kept:
                raise Diverged(
                    f"messages[{i}] differs from the recorded conversation (sent {str(sent)[:200]!r}, "
                    f"recorded {str(kept)[:200]!r}): send earlier turns back exactly as returned"
                )
        new = messages[len(recorded) :]
        try:
            added = t.renderer.observation(new, t.record.tokens[-1], t.stopped)
        except Exception as exc:
            raise BadCall(
                f"messages: the chat template cannot render the new ones: {exc}"
            ) from None
        return self._plan(t, None, added, max_tokens, messages=messages)

    def completion(self, t: AgentTrajectory, prompt, max_tokens: int) -> Plan:
        if t.kind not in (None, "completions"):
            raise Diverged(
                "this trajectory is recorded through /chat/completions, not /completions"
            )
        if isinstance(prompt, list) and prompt and all(isinstance(i, int) for i in prompt):
            if min(prompt) < 0 or max(prompt) >= self.vocab:
                raise BadCall(f"prompt: token id outside the vocabulary [0, {self.vocab})")
            if t.kind is None:
                return self._plan(t, list(prompt), [], max_tokens, text="")
            so_far = t.record.prompt + t.record.tokens
            if prompt[: len(so_far)] != so_far or len(prompt) == len(so_far):
                raise Diverged("prompt: the token ids do not extend the recorded ones")
            return self._plan(t, None, prompt[len(so_far) :], max_tokens, text=t.text)
        if not isinstance(prompt, str) or not prompt:
            raise BadCall("prompt: expected a non-empty string or a list of token ids")
        encode = lambda text: self.tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
        if t.kind is None:
            return self._plan(t, encode(prompt), [], max_tokens, text=prompt)
        if not prompt.startswith(t.text) or prompt == t.text:
            raise Diverged(
                "prompt: does not extend the recorded text (earlier prompts and completions, "
                "exactly as returned) with new text"
            )
        return self._plan(t, None, encode(prompt[len(t.text) :]), max_tokens, text=prompt)

    def _plan(self, t, prompt, added, max_tokens, messages=None, text=None) -> Plan:
        if prompt is not None:
            if not prompt:
                raise BadCall("the prompt renders to no tokens")
            # the learner refuses longer ones (broker.semantics)
            if len(prompt) > self.max_prompt_tokens:
                raise BadCall(
                    f"the first prompt is {len(prompt)} tokens, over rollout.max_prompt_tokens={self.max_prompt_tokens}"
                )
            so_far, prompt_len, used = prompt, len(prompt), 0
        else:
            so_far = t.record.prompt + t.record.tokens + added
            prompt_len, used = len(t.record.prompt), len(t.record.tokens) + len(added)
        budget = min(
            max_tokens, self.max_total_tokens - used, self.max_positions - prompt_len - used
        )
        if budget < 1:
            raise BadCall(
                f"the trajectory has no room left: {used} tokens after its prompt of {prompt_len} "
                f"(agent.max_total_tokens {self.max_total_tokens}, model positions {self.max_positions})"
            )
        return Plan(so_far, prompt, added, messages, text, budget)

    # -- recording -------------------------------------------------------------------------------

    def record(self, t: AgentTrajectory, plan: Plan, output: Output, returned) -> None:
        """Append the call: the agent's new tokens (mask 0) and the engine's (mask 1).
        ``returned``: the assistant message (chat) or text (completions) sent back."""
        if t.kind is None:
            t.kind = "completions" if plan.text is not None else "chat"
            t.record = Trajectory(None, plan.prompt, [])
            t.prompt_text = plan.text or ""
        if plan.added:
            t.record.add_environment(plan.added)
        t.record.add_model_turn(output)
        if plan.messages is not None:
            t.record.messages = plan.messages + [normalize(returned, "returned")]
        else:
            t.text = plan.text + returned
        t.stopped = output.finish_reason == "stop"
        t.last_turn = assistant_turn(self.tokenizer, output)

    @staticmethod
    def conversation(t: AgentTrajectory, first: list[dict]) -> list[dict]:
        """What the reward functions score: the recorded chat (its last assistant turn with its
        raw text), or for ``completions`` the row's first messages and the text after the first
        prompt as one assistant turn."""
        if t.kind == "chat":
            return t.record.messages[:-1] + [{**t.record.messages[-1], **t.last_turn}]
        text = t.text[len(t.prompt_text) :]
        return first + [{**t.last_turn, "content": text, "raw_content": text}]

    def close(self, t: AgentTrajectory, reward: float | None) -> None:
        t.closed = True
        t.reward = reward
        if t.record is not None:
            t.record.end = "done"


def group_outputs(group: AgentGroup, max_total_tokens: int) -> tuple[list[int], list[Output]]:
    """The group's prompt (the longest common prefix of its trajectories' first prompts) and each
    trajectory after it as an engine ``Output`` with its loss mask: a trajectory whose first
    prompt is longer than the group's carries the rest as tokens of mask 0. ValueError if a
    trajectory made no call, the prompts share no token, or that rest makes a trajectory longer
    than ``max_total_tokens`` (the learner's bound)."""
    records = [t.record for t in group.trajectories]
    if any(r is None for r in records):
        raise ValueError("a trajectory of the group made no call")
    common = records[0].prompt
    for r in records[1:]:
        n = min(len(common), len(r.prompt))
        differ = np.flatnonzero(np.asarray(common[:n]) != np.asarray(r.prompt[:n]))
        common = common[: int(differ[0]) if differ.size else n]
    if not common:
        raise ValueError("the trajectories' first prompts share no token")
    outputs = []
    for j, r in enumerate(records):
        out = r.output(str(j))
        rest = r.prompt[len(common) :]
        if rest:
            # the earliest version: versions stay non-decreasing along the completion
            out = replace(
                out,
                token_ids=np.concatenate([np.asarray(rest, np.int32), out.token_ids]),
                logprobs=np.concatenate([np.zeros(len(rest), np.float32), out.logprobs]),
                versions=np.concatenate(
                    [np.full(len(rest), out.versions[0], np.int32), out.versions]
                ),
                meta={
                    **out.meta,
                    "loss_mask": np.concatenate(
                        [np.zeros(len(rest), np.uint8), out.meta["loss_mask"]]
                    ),
                },
            )
        if len(out.token_ids) > max_total_tokens:
            raise ValueError(
                f"trajectory {j}: {len(rest)} tokens of its first prompt beyond the group's "
                f"make it longer than agent.max_total_tokens={max_total_tokens}"
            )
        outputs.append(out)
    return common, outputs
