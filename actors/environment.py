"""Multi-turn environments: the interface, loading one from a config, and calling it safely.

An environment (``env.name``: ``module:Class`` or ``path/to/file.py:Class``, any callable that
returns a fresh one; called once per trajectory) has:

- ``reset(row) -> list[dict]``: the first messages (chat ``{role, content}``). ``row`` is the
  dataset row: ``messages`` (its prompt as messages), ``answer`` and its other columns;
- ``step(turn) -> Step``: ``turn`` is the model's assistant message (``content``, ``raw_content``,
  ``finish_reason``, and ``tool_calls`` parsed from Qwen/Hermes ``<tool_call>`` JSON); the
  ``Step`` holds the observation (messages: ``user`` or ``tool`` turns), an optional reward and
  whether the trajectory is done;
- optionally ``tools``: plain Python functions (typed, with a Google-style docstring), described
  to the model through its chat template's tool format (``apply_chat_template(tools=...)``).
  ``ToolEnvironment`` runs the tool calls of a turn for a subclass.

A call that raises, runs past ``env.step_timeout_s`` or returns something else than the above
ends its trajectory with that reason (``error``, ``timeout``, ``invalid``); the actor goes on.
``ToolEnvironment`` runs each tool call in a forked process that a timed-out step kills
(``stop``), so a hung tool is stopped, not abandoned. Other environment code runs on a thread,
which Python cannot kill: a hung one is abandoned (a daemon); an environment is the config's own
code, trusted like a reward plug-in. Neither a fork nor a thread is a sandbox: code the *model*
wrote belongs in ``actors.sandbox`` (a tool that runs it calls ``sandbox.run_python``).
"""

from __future__ import annotations

import json
import math
import multiprocessing
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from streamrl.actors import plugins
from streamrl.broker.env_stats import END_REASONS, TOOL_FAILURES
from streamrl.configs.errors import ConfigError

ROLES = ("system", "user", "assistant", "tool")
TRUNCATED = frozenset(END_REASONS) - {"done"}
# the tool-call failures an environment judges (``Step.tool_failures``); "parse" the actor
# counts itself, from the blocks it parsed
ENV_TOOL_FAILURES = frozenset(TOOL_FAILURES) - {"parse"}


# how long a stopped step's thread may take to notice its tools were killed
STOP_WAIT_S = 5.0


class EnvFailure(Exception):
    """A ``reset``/``step`` call failed; ``reason`` is one of error, timeout, invalid."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


class ToolRaised(Exception):
    """A tool raised (``ToolEnvironment``): the trajectory ends with ``error``, and the call is
    counted as a tool failure ``raised``."""


@dataclass
class Step:
    """What ``step`` returns. ``tool_failures``: the reason of each of the turn's tool calls that
    failed (``unknown_tool``, ``bad_arguments``), for the metrics; ``ToolEnvironment`` fills it."""

    messages: list[dict] = field(default_factory=list)
    reward: float | None = None
    done: bool = False
    tool_failures: list[str] = field(default_factory=list)


def load(name: str) -> Callable[[], Any]:
    """The factory ``env.name`` names (ValueError with the reason if it cannot be loaded)."""
    return plugins.load(name, f"env.name {name!r}")


def check(env_cfg) -> None:
    """An ``env.name`` that cannot load fails here, before anything starts."""
    if env_cfg.name:
        try:
            load(env_cfg.name)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None


def call(fn: Callable, arg, timeout_s: float):
    """``fn(arg)`` on a daemon thread, waited for at most ``timeout_s``; EnvFailure if it raises
    or hangs."""
    result: dict[str, Any] = {}

    def target() -> None:
        try:
            result["value"] = fn(arg)
        # an environment is user code: anything it raises ends only its trajectory
        except BaseException as exc:
            result["error"] = exc

    thread = threading.Thread(target=target, name="env-step", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        # a tool environment's step waits on tool processes: killing them ends the thread
        stop = getattr(getattr(fn, "__self__", None), "stop", None)
        if callable(stop):
            stop()
            thread.join(STOP_WAIT_S)
        raise EnvFailure("timeout", f"no answer within {timeout_s} s")
    if "error" in result:
        raise EnvFailure("error", repr(result["error"])) from result["error"]
    return result["value"]


def check_messages(messages, what: str) -> list[dict]:
    """A non-empty list of ``{role, content: str}`` with a known role (EnvFailure invalid if not)."""
    if not isinstance(messages, list) or not messages:
        raise EnvFailure("invalid", f"{what}: expected a non-empty list of messages")
    for m in messages:
        if (
            not isinstance(m, dict)
            or m.get("role") not in ROLES
            or not isinstance(m.get("content"), str)
        ):
            raise EnvFailure(
                "invalid", f"{what}: {str(m)[:200]!r} is not a {{role, content}} message"
            )
    return messages


def check_step(value, tool_calls: int = 0) -> Step:
    """A ``Step`` with valid messages (none only when done), a finite reward or None, and at most
    one tool failure for each of the turn's ``tool_calls``."""
    if not isinstance(value, Step):
        raise EnvFailure("invalid", f"step returned {type(value).__name__}, expected a Step")
    if not isinstance(value.done, bool):
        raise EnvFailure("invalid", "step: done must be a bool")
    reward = value.reward
    if reward is not None and (
        isinstance(reward, bool)
        or not isinstance(reward, (int, float))
        or not math.isfinite(reward)
    ):
        raise EnvFailure("invalid", f"step: reward {reward!r} is not a finite number")
    failures = value.tool_failures
    if not isinstance(failures, list) or not all(f in ENV_TOOL_FAILURES for f in failures):
        raise EnvFailure(
            "invalid", f"step: tool_failures must be a list of {sorted(ENV_TOOL_FAILURES)}"
        )
    if len(failures) > tool_calls:
        raise EnvFailure(
            "invalid", f"step: {len(failures)} tool failures for {tool_calls} tool calls"
        )
    if not value.done:
        check_messages(value.messages, "step")
    return value


# -- tools -----------------------------------------------------------------------------------

_OPEN, _CLOSE = "<tool_call>", "</tool_call>"


def tool_call_spans(text: str) -> list[tuple[int, int]]:
    """Where each ``<tool_call>...</tool_call>`` block of ``text`` starts and ends (tags included),
    the first closing tag after an opening one ending it. A scan with ``str.find``, linear in the
    text: a backtracking regex takes seconds on an unclosed tag followed by whitespace, which a
    model's turn (or an agent) can produce."""
    spans = []
    start = text.find(_OPEN)
    while start != -1:
        end = text.find(_CLOSE, start + len(_OPEN))
        if end == -1:
            break
        spans.append((start, end + len(_CLOSE)))
        start = text.find(_OPEN, end + len(_CLOSE))
    return spans


def strip_tool_calls(text: str) -> str:
    """``text`` without its tool-call blocks."""
    kept, last = [], 0
    for start, end in tool_call_spans(text):
        kept.append(text[last:start])
        last = end
    return "".join(kept) + text[last:]


def parse_tool_calls(text: str) -> list[dict]:
    """The Qwen/Hermes ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks of a turn,
    as ``{name, arguments}``; a block that is not such JSON is returned as ``{"error": why}``."""
    calls = []
    for start, end in tool_call_spans(text):
        block = text[start + len(_OPEN) : end - len(_CLOSE)].strip()
        try:
            call_ = json.loads(block)
        except json.JSONDecodeError as exc:
            calls.append({"error": f"not JSON: {exc}"})
            continue
        if (
            not isinstance(call_, dict)
            or not isinstance(call_.get("name"), str)
            or not isinstance(call_.get("arguments", {}), dict)
        ):
            calls.append({"error": "expected {name: str, arguments: object}"})
            continue
        calls.append({"name": call_["name"], "arguments": call_.get("arguments", {})})
    return calls


class ToolStopped(Exception):
    """A tool's process was killed (its step ran past ``env.step_timeout_s``)."""


def _tool_process(conn, fn: Callable, arguments: dict) -> None:
    # what comes back is the tool's text, or the exception's kind and text (not the exception:
    # it may not pickle)
    try:
        conn.send(("ok", str(fn(**arguments))))
    except TypeError as exc:
        conn.send(("arguments", str(exc)))
    except BaseException as exc:
        conn.send(("raised", repr(exc)))


class ToolEnvironment:
    """A base for environments whose model calls tools: ``step`` runs the turn's tool calls and
    answers with their results as ``tool`` messages; a turn without tool calls goes to ``answer``.

    A call of an unknown tool or with bad arguments is answered with the error text (the model
    made the mistake and may learn from it) and reported in ``Step.tool_failures``; an exception
    inside a tool ends the trajectory (``ToolRaised``).
    """

    tools: list[Callable] = []

    def _running(self) -> list:
        # per environment (one trajectory): the tool processes its step waits on
        if "_tool_procs" not in self.__dict__:
            self._tool_procs: list = []
        return self._tool_procs

    def stop(self) -> None:
        """Kill the tool processes of the step in flight, and any it starts after (``call`` does
        on a timeout: the trajectory ends there)."""
        self._stopped = True
        for proc in list(self._running()):
            if proc.pid is not None:
                proc.kill()

    def run_tool(self, fn: Callable, arguments: dict) -> str:
        """``fn(**arguments)`` in a forked process (a fork: any tool, closures too, runs without
        pickling); TypeError for arguments that do not fit, ToolRaised if it raised, ToolStopped
        if it was killed."""
        ctx = multiprocessing.get_context("fork")
        receive, send = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=_tool_process, args=(send, fn, arguments), daemon=True)
        self._running().append(proc)
        try:
            proc.start()
            send.close()
            # stopped while it started
            if getattr(self, "_stopped", False):
                proc.kill()
            try:
                kind, text = receive.recv()
            # the process died (killed by ``stop``) before it answered
            except EOFError:
                raise ToolStopped(f"tool {fn.__name__!r} was stopped") from None
        finally:
            receive.close()
            proc.kill()
            proc.join()
            self._running().remove(proc)
        if kind == "arguments":
            raise TypeError(text)
        if kind == "raised":
            raise ToolRaised(f"tool {fn.__name__!r} raised {text}")
        return text

    def reset(self, row: dict) -> list[dict]:
        raise NotImplementedError

    def answer(self, turn: dict) -> Step:
        """The model answered without a tool call: score it, or send feedback."""
        raise NotImplementedError

    def step(self, turn: dict) -> Step:
        calls = turn.get("tool_calls") or []
        if not calls:
            return self.answer(turn)
        by_name = {fn.__name__: fn for fn in self.tools}
        results, failures = [], []
        for c in calls:
            fn = by_name.get(c.get("name"))
            if "error" in c:
                content = f"error: {c['error']}"
            elif fn is None:
                content = f"error: no tool {c['name']!r}"
                failures.append("unknown_tool")
            else:
                try:
                    content = self.run_tool(fn, c["arguments"])
                # the arguments do not fit the tool (Python says so with a TypeError)
                except TypeError as exc:
                    content = f"error: {exc}"
                    failures.append("bad_arguments")
            results.append({"role": "tool", "name": c.get("name", ""), "content": content})
        return Step(messages=results, tool_failures=failures)
