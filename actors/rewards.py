"""Reward functions: built-ins, ``module:function`` plug-ins, and a contained worker pool that runs them.

A reward function has RL2's signature ``fn(messages, answer, **kwargs) -> float |
dict[str, float]``: ``messages`` is the conversation ending with the assistant
turn ``{"role": "assistant", "content": text, "raw_content": ..., "finish_reason": ...}``
(``content`` without special tokens, ``raw_content`` with them, EOS included). A dict
return is a set of named parts whose sum is the function's value. The scalar
reward is the weighted sum over ``cfg.reward.functions``.

Containment: rewards run in worker processes. A reward that raises, returns
something that is not a finite number, sleeps past ``cfg.reward.timeout_s`` or
runs out of memory (``worker_memory_mb`` address-space limit) scores 0 for that
sample; the failure is counted by kind in
``streamrl_actor_reward_failures_total`` and logged, and a hung or dead worker
is killed and replaced. The actor never stops for a reward.
"""

from __future__ import annotations

import importlib
import logging
import math
import multiprocessing
import multiprocessing.connection
import re
import resource
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from actors import metrics
from actors.demo_task import EOS, reverse_digits_reward
from actors.sandbox import run_python

log = logging.getLogger(__name__)

RewardFn = Callable[..., "float | dict[str, float]"]


# -- built-ins ---------------------------------------------------------------------------------


def _completion(messages: list[dict]) -> dict:
    if not messages or messages[-1].get("role") != "assistant":
        raise ValueError("messages must end with the assistant turn")
    return messages[-1]


def reverse_digits(messages, answer, **_) -> dict[str, float]:
    """The demo task's shaped reward (see actors.demo_task) on the text with special tokens kept.

    Without ``raw_content`` (a caller that only has the clean text) EOS is appended on a stop.
    """
    turn = _completion(messages)
    text = turn.get("raw_content")
    if text is None:
        text = turn["content"] + (EOS if turn.get("finish_reason") == "stop" else "")
    return reverse_digits_reward(text, str(answer))


def exact_match(messages, answer, strip: bool = True, **_) -> float:
    text = _completion(messages)["content"]
    target = str(answer)
    if strip:
        text, target = text.strip(), target.strip()
    return float(text == target)


_THINK = re.compile(r"^\s*<think>(?P<thought>.+?)</think>\s*(?P<answer>\S.*)$", re.DOTALL)


def think_format(messages, answer=None, **_) -> float:
    """1 when the completion is ``<think>…</think>`` followed by a non-empty answer, tags used once."""
    text = _completion(messages)["content"]
    match = _THINK.match(text)
    if not match or text.count("<think>") != 1 or text.count("</think>") != 1:
        return 0.0
    return float(bool(match["thought"].strip()))


def math_equivalence(messages, answer, **_) -> float:
    """1 when math-verify finds the completion's final answer equivalent to ``answer``."""
    from math_verify import parse, verify

    gold = parse(str(answer) if "$" in str(answer) or "\\boxed" in str(answer) else f"${answer}$")
    predicted = parse(_completion(messages)["content"])
    return float(bool(gold) and bool(predicted) and verify(gold, predicted))


_CODE_BLOCK = re.compile(r"```(?:python|py)?\s*\n(.*?)```", re.DOTALL)


def extract_code(text: str) -> str:
    """The last fenced code block, or the whole text when there is none."""
    blocks = _CODE_BLOCK.findall(text)
    return blocks[-1] if blocks else text


def code_execution(messages, answer, timeout_s: float = 5.0, memory_mb: int = 512, **_) -> float:
    """Run the completion's code in the sandbox against the tests in ``answer``.

    ``answer`` is either test code (asserts appended after the solution; 1 if it
    exits 0) or a list of ``{"input": stdin, "output": expected stdout}`` cases
    (the fraction that print the expected output).
    """
    code = extract_code(_completion(messages)["content"])
    if isinstance(answer, str):
        return float(
            run_python(code + "\n\n" + answer, timeout_s=timeout_s, memory_mb=memory_mb).ok
        )
    if not isinstance(answer, list) or not answer:
        raise ValueError(
            "code reward: answer must be test code or a non-empty list of {input, output} cases"
        )
    passed = 0
    for case in answer:
        result = run_python(
            code, stdin=str(case.get("input", "")), timeout_s=timeout_s, memory_mb=memory_mb
        )
        passed += result.ok and result.stdout.strip() == str(case.get("output", "")).strip()
    return passed / len(answer)


BUILTINS: dict[str, RewardFn] = {
    "reverse_digits": reverse_digits,
    "exact_match": exact_match,
    "math": math_equivalence,
    "think_format": think_format,
    "code": code_execution,
}


def resolve(name: str) -> RewardFn:
    """A built-in by name or a plug-in ``module:function``; raises ValueError with the reason."""
    if name in BUILTINS:
        return BUILTINS[name]
    module_name, sep, attr = name.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(
            f"unknown reward {name!r}: built-ins are {sorted(BUILTINS)}, plug-ins are module:function"
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"reward {name!r}: cannot import {module_name!r}: {exc}") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ValueError(f"reward {name!r}: {module_name} has no callable {attr!r}")
    return fn


# -- scoring one sample (runs in a worker) -----------------------------------------------------


@dataclass
class Score:
    total: float
    parts: dict[str, float] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)  # failure kinds, one per failed function


def _as_parts(name: str, value) -> dict[str, float]:
    """A reward's return value as named finite parts; ValueError for anything else."""
    if isinstance(value, bool) or not isinstance(value, (int, float, dict)):
        raise ValueError(f"returned {type(value).__name__}, expected a number or a dict of numbers")
    items = value.items() if isinstance(value, dict) else [(None, value)]
    parts = {}
    for key, part in items:
        if isinstance(part, bool) or not isinstance(part, (int, float)) or not math.isfinite(part):
            raise ValueError(f"part {key!r} is {part!r}, expected a finite number")
        parts[name if key is None else f"{name}/{key}"] = float(part)
    return parts


def score_sample(specs: Sequence[dict], fns: Sequence[RewardFn], messages, answer) -> Score:
    """Weighted total over the reward functions; a failing function contributes 0 and is reported."""
    score = Score(0.0)
    for spec, fn in zip(specs, fns, strict=True):
        try:
            parts = _as_parts(spec["fn"], fn(messages, answer, **spec.get("kwargs", {})))
        except MemoryError:
            score.failures.append("memory")
            continue
        except ValueError as exc:
            kind = "invalid" if "expected" in str(exc) else "exception"
            score.failures.append(kind)
            log.warning("reward %s failed (%s): %s", spec["fn"], kind, exc)
            continue
        except Exception as exc:  # a plug-in may raise anything; it must not stop the actor
            score.failures.append("exception")
            log.warning("reward %s raised %s: %s", spec["fn"], type(exc).__name__, exc)
            continue
        score.parts.update(parts)
        score.total += spec.get("weight", 1.0) * sum(parts.values())
    return score


def _worker(conn, specs: list[dict], memory_mb: int) -> None:
    fns = [resolve(spec["fn"]) for spec in specs]
    with open("/proc/self/statm") as f:
        current = int(f.read().split()[0]) * resource.getpagesize()
    limit = current + (memory_mb << 20)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    while True:
        try:
            task = conn.recv()
        except EOFError:
            return
        messages, answer = task
        conn.send(score_sample(specs, fns, messages, answer))


# -- the pool ------------------------------------------------------------------------------------


class _Worker:
    def __init__(self, ctx, specs: list[dict], memory_mb: int) -> None:
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=_worker, args=(child, specs, memory_mb), daemon=True)
        self.process.start()
        child.close()

    def kill(self) -> None:
        self.process.kill()
        self.process.join(timeout=5)
        self.conn.close()


class RewardPool:
    """Scores samples in ``workers`` processes, each sample under a time limit."""

    def __init__(self, reward_cfg) -> None:
        self.specs = [spec.model_dump() for spec in reward_cfg.functions]
        for spec in self.specs:
            if (
                spec["fn"] == "code"
            ):  # the sandbox limits come from cfg.reward unless a spec overrides them
                spec["kwargs"] = {
                    "timeout_s": reward_cfg.sandbox_timeout_s,
                    "memory_mb": reward_cfg.sandbox_memory_mb,
                } | spec["kwargs"]
        for spec in self.specs:
            resolve(spec["fn"])  # a bad name or plug-in fails here, before anything starts
        self.timeout_s = reward_cfg.timeout_s
        self.memory_mb = reward_cfg.worker_memory_mb
        self._ctx = multiprocessing.get_context("spawn")
        self._workers = [self._spawn() for _ in range(reward_cfg.workers)]

    def _spawn(self) -> _Worker:
        return _Worker(self._ctx, self.specs, self.memory_mb)

    def score(self, samples: Sequence[tuple[list[dict], object]]) -> list[Score]:
        """Score ``(messages, answer)`` samples; failures score 0 and are counted by kind."""
        results: list[Score | None] = [None] * len(samples)
        queue = list(range(len(samples)))[::-1]
        busy: dict[int, tuple[int, float]] = {}  # worker slot -> (sample index, deadline)
        while queue or busy:
            for slot in range(len(self._workers)):
                if slot not in busy and queue:
                    index = queue.pop()
                    try:
                        self._workers[slot].conn.send(samples[index])
                    except (BrokenPipeError, OSError):
                        self._replace(slot)
                        self._workers[slot].conn.send(samples[index])
                    busy[slot] = (index, time.monotonic() + self.timeout_s)
            wait_s = max(0.0, min(deadline for _, deadline in busy.values()) - time.monotonic())
            ready = multiprocessing.connection.wait(
                [self._workers[s].conn for s in busy], timeout=wait_s
            )
            for slot in list(busy):
                index, deadline = busy[slot]
                worker = self._workers[slot]
                if worker.conn in ready:
                    try:
                        results[index] = worker.conn.recv()
                    except (EOFError, OSError):
                        results[index] = self._failed("crash", index)
                        self._replace(slot)
                    del busy[slot]
                elif time.monotonic() >= deadline:
                    results[index] = self._failed("timeout", index)
                    self._replace(slot)
                    del busy[slot]
        for result in results:
            for kind in result.failures:
                metrics.REWARD_FAILURES.labels(kind=kind).inc()
        return results

    def _failed(self, kind: str, index: int) -> Score:
        log.warning("reward worker %s on sample %d; it scores 0", kind, index)
        return Score(0.0, failures=[kind])

    def _replace(self, slot: int) -> None:
        self._workers[slot].kill()
        self._workers[slot] = self._spawn()

    def close(self) -> None:
        for worker in self._workers:
            worker.kill()

    def __enter__(self) -> RewardPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
