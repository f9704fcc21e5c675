"""Reward functions: built-ins, plug-ins, and a contained worker pool that runs them.

Two signatures. Per sample (RL2's): ``fn(messages, answer, **columns) -> float | dict[str,
float]``: ``messages`` is the conversation ending with the assistant turn ``{"role":
"assistant", "content": text, "raw_content": ..., "finish_reason": ...}`` (``content``
without special tokens, ``raw_content`` with them, EOS included). Batched (TRL's):
``fn(prompts, completions, completion_ids, **columns) -> list[float | None]``, one value per
sample, every argument a list (``None``: the function does not apply to that sample). Which
form a function has is read from its signature (``is_batched``: a ``prompts``,
``completions`` or ``completion_ids`` parameter and no ``messages`` is TRL's); the spec's
``batched`` forces it. ``columns`` are the dataset row's other columns (and
``answer``), passed by name to the functions that declare them (all of them to a
``**kwargs``); the spec's ``kwargs`` are added to every call. A dict return is a set of
named parts whose sum is the function's value; parts are named after the spec's ``name``,
else its ``fn``. The scalar reward is the weighted sum over
``cfg.reward.functions``. A function is named as a built-in, ``module:function`` or
``path/to/file.py:function``.

Containment: rewards run in worker processes, one message per chunk of samples each way
and back (a chunk is a worker's share of one ``score`` call). A per-sample reward that
raises, returns something that is not a finite number, sleeps past
``cfg.reward.timeout_s`` or runs out of memory (``worker_memory_mb`` address-space limit)
scores 0 for that sample alone; a batched one that fails scores 0 for its chunk. Each
``Score`` names the functions that failed on it and their exceptions, which the actor sends
with the group (``failure_meta``), so the learner reports each function's failure rate per
step and stops a run whose reward keeps failing (``reward.max_failing_steps``). Failures are
also counted by kind in ``streamrl_actor_reward_failures_total`` and logged; a hung or dead
worker is killed and replaced, and the rest of its chunk goes to the new one. The actor
never stops for a reward.
"""

from __future__ import annotations

import inspect
import logging
import math
import multiprocessing
import multiprocessing.connection
import re
import resource
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from streamrl.actors import metrics, plugins
from streamrl.actors.sandbox import run_python
from streamrl.broker import reward_failures
from streamrl.configs.errors import ConfigError
from streamrl.configs.schema import BUILTIN_REWARD_RANGES

log = logging.getLogger(__name__)

RewardFn = Callable[..., "float | dict[str, float]"]
# failure kinds of a worker that hung or died on a sample, rather than of one function
WORKER_LOST = frozenset({"timeout", "crash"})
# a fresh worker's imports (a plug-in, math-verify's sympy) do not count against a sample's time
STARTUP_S = 120.0


# -- built-ins ---------------------------------------------------------------------------------


def completion_turn(messages: list[dict]) -> dict:
    """The assistant turn a reward scores: the last message."""
    if not messages or messages[-1].get("role") != "assistant":
        raise ValueError("messages must end with the assistant turn")
    return messages[-1]


def exact_match(messages, answer, strip: bool = True, **_) -> float:
    text = completion_turn(messages)["content"]
    target = str(answer)
    if strip:
        text, target = text.strip(), target.strip()
    return float(text == target)


_THINK = re.compile(r"^\s*<think>(?P<thought>.+?)</think>\s*(?P<answer>\S.*)$", re.DOTALL)


def think_format(messages, answer=None, **_) -> float:
    """1 when the completion is ``<think>…</think>`` followed by a non-empty answer, tags used once."""
    text = completion_turn(messages)["content"]
    match = _THINK.match(text)
    if not match or text.count("<think>") != 1 or text.count("</think>") != 1:
        return 0.0
    return float(bool(match["thought"].strip()))


def math_equivalence(messages, answer, **_) -> float:
    """1 when math-verify finds the completion's final answer equivalent to ``answer``."""
    from math_verify import parse, verify

    gold = parse(str(answer) if "$" in str(answer) or "\\boxed" in str(answer) else f"${answer}$")
    predicted = parse(completion_turn(messages)["content"])
    return float(bool(gold) and bool(predicted) and verify(gold, predicted))


_CODE_BLOCK = re.compile(r"```(?:python|py)?\s*\n(.*?)```", re.DOTALL)


def extract_code(text: str) -> str:
    """The last fenced code block, or the whole text when there is none."""
    blocks = _CODE_BLOCK.findall(text)
    return blocks[-1] if blocks else text


def code_execution(messages, answer, timeout_s: float = 5.0, memory_mb: int = 512, **_) -> float:
    """Run the completion's code in the sandbox against the tests in ``answer``.

    ``answer`` is either test code (run after the solution in its namespace; 1 only if the
    tests ran to their end, checked with a nonce the program never sees, and it exits 0) or a list of ``{"input": stdin, "output": expected stdout}`` cases
    (the fraction that print the expected output).
    """
    code = extract_code(completion_turn(messages)["content"])
    if isinstance(answer, str):
        return float(run_python(code, timeout_s=timeout_s, memory_mb=memory_mb, tests=answer).ok)
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


_GSM8K_GOLD = re.compile(r"####\s*(?P<number>.+?)\s*$", re.DOTALL)


def gsm8k(messages, answer, **_) -> float:
    """1 when the completion's final answer equals GSM8K's: the number after ``####`` in the
    dataset's solution (thousands separators dropped), compared by math-verify."""
    from math_verify import parse, verify

    match = _GSM8K_GOLD.search(str(answer))
    number = (match["number"] if match else str(answer)).replace(",", "").strip()
    gold = parse(f"${number}$")
    predicted = parse(completion_turn(messages)["content"])
    return float(bool(gold) and bool(predicted) and verify(gold, predicted))


# their declared ranges are configs.schema.BUILTIN_REWARD_RANGES (the learner checks entries by them)
BUILTINS: dict[str, RewardFn] = {
    "exact_match": exact_match,
    "gsm8k": gsm8k,
    "math": math_equivalence,
    "think_format": think_format,
    "code": code_execution,
}


def resolve(name: str) -> RewardFn:
    """A built-in, a ``module:function`` or a ``path/to/file.py:function``; ValueError with the reason."""
    if name in BUILTINS:
        return BUILTINS[name]
    if not plugins.is_reference(name):
        raise ValueError(
            f"unknown reward {name!r}: built-ins are {sorted(BUILTINS)}, plug-ins are {plugins.FORMS}"
        )
    return plugins.load(name, f"reward {name!r}")


def check(reward_cfg) -> None:
    """No reward, a bad name or a plug-in that cannot load fails here, before anything starts."""
    if not reward_cfg.functions:
        raise ConfigError(
            f"reward.functions is empty: name at least one reward (a built-in, {plugins.FORMS})"
        )
    for i, spec in enumerate(reward_cfg.functions):
        try:
            resolve(spec.fn)
        except ValueError as exc:
            raise ConfigError(f"reward.functions[{i}].fn: {exc}") from None


_TRL_ARGUMENTS = {"prompts", "completions", "completion_ids"}


def is_batched(spec: dict, fn: RewardFn) -> bool:
    """The spec's ``batched`` when set, else from the signature: TRL's form names ``prompts``,
    ``completions`` or ``completion_ids`` and has no ``messages``."""
    if spec.get("batched") is not None:
        return bool(spec["batched"])
    try:
        names = set(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return False
    return bool(names & _TRL_ARGUMENTS) and "messages" not in names


def part_name(spec: dict) -> str:
    """What a function's parts are named after: the spec's ``name``, else its ``fn``."""
    return spec.get("name") or spec["fn"]


def accepted_columns(fn: RewardFn) -> set[str] | None:
    """The keyword arguments ``fn`` declares (None: it takes ``**kwargs``, so every column)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    return {p.name for p in params}


# -- scoring (runs in a worker) ----------------------------------------------------------------


@dataclass
class RewardInput:
    """One sample to score: the conversation with the completion, the answer, the row's columns."""

    messages: list[dict]
    answer: Any = None
    columns: dict[str, Any] = field(default_factory=dict)
    # the prompt was a string column: batched rewards get strings, as TRL gives them
    conversational: bool = True
    # the completion's token ids (TRL's completion_ids)
    completion_ids: list[int] = field(default_factory=list)

    @classmethod
    def of(cls, sample) -> RewardInput:
        return sample if isinstance(sample, RewardInput) else cls(*sample)


class Failure(NamedTuple):
    """Why a function scored 0 on a sample: the kind counted in the metric, and the exception."""

    kind: str
    error: str


@dataclass
class Score:
    total: float
    parts: dict[str, float] = field(default_factory=dict)
    # the functions (by part name) that failed on this sample
    failures: dict[str, Failure] = field(default_factory=dict)


def failure_meta(scores: Sequence[Score]) -> dict[str, int | str]:
    """A group's reward failures as the scalar meta the learner reads (``broker.reward_failures``)."""
    return reward_failures.encode(
        [{name: f.error for name, f in score.failures.items()} for score in scores]
    )


def _as_parts(name: str, value, bounds=None) -> dict[str, float]:
    """A reward's return value as named finite parts, each and their sum within ``bounds`` (the
    function's declared range, when it has one); ValueError for anything else."""
    if isinstance(value, bool) or not isinstance(value, (int, float, dict)):
        raise ValueError(f"returned {type(value).__name__}, expected a number or a dict of numbers")
    items = value.items() if isinstance(value, dict) else [(None, value)]
    parts = {}
    for key, part in items:
        if isinstance(part, bool) or not isinstance(part, (int, float)) or not math.isfinite(part):
            raise ValueError(f"part {key!r} is {part!r}, expected a finite number")
        parts[name if key is None else f"{name}/{key}"] = float(part)
    if bounds is not None:
        low, high = bounds
        # the learner dead-letters a group with a value outside its range: it fails here alone
        for part in [*parts.values(), sum(parts.values())]:
            if not low <= part <= high:
                raise ValueError(
                    f"{part!r} is outside the declared range, expected [{low}, {high}]"
                )
    return parts


def _failure(name: str, exc: BaseException) -> Failure:
    error = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, MemoryError):
        return Failure("memory", error)
    kind = "invalid" if isinstance(exc, ValueError) and "expected" in str(exc) else "exception"
    log.warning("reward %s failed (%s): %s", name, kind, error)
    return Failure(kind, error)


def _call_kwargs(spec: dict, allowed: set[str] | None, columns: dict) -> dict:
    picked = {k: v for k, v in columns.items() if allowed is None or k in allowed}
    return picked | spec.get("kwargs", {})


def score_sample(
    specs: Sequence[dict],
    fns: Sequence[RewardFn],
    messages,
    answer,
    columns: dict | None = None,
    batched: Sequence[dict[str, float] | Failure | None] | None = None,
) -> Score:
    """Weighted total over the reward functions; a failing function contributes 0 and is reported.

    ``batched[i]``: the parts batched function ``i`` gave this sample, or its Failure.
    """
    score = Score(0.0)
    for i, (spec, fn) in enumerate(zip(specs, fns, strict=True)):
        if is_batched(spec, fn):
            parts = batched[i] if batched else None
            if isinstance(parts, Failure):
                score.failures[part_name(spec)] = parts
                continue
            parts = parts or {}
        else:
            # the signature only filters columns, and reading it costs more than a demo reward
            allowed = accepted_columns(fn) if columns else None
            try:
                value = fn(messages, answer, **_call_kwargs(spec, allowed, columns or {}))
                parts = _as_parts(part_name(spec), value, spec.get("range"))
            # a plug-in may raise anything (MemoryError included)
            except Exception as exc:
                score.failures[part_name(spec)] = _failure(part_name(spec), exc)
                continue
        score.parts.update(parts)
        score.total += spec.get("weight", 1.0) * sum(parts.values())
    return score


def _batched_arguments(inputs: list[RewardInput]) -> dict[str, list]:
    """TRL's arguments: prompts and completions (conversations or strings), the completions'
    token ids, and one list per column."""
    prompts, completions = [], []
    for x in inputs:
        prompt, completion = x.messages[:-1], x.messages[-1]
        if x.conversational:
            prompts.append(prompt)
            completions.append([{"role": "assistant", "content": completion["content"]}])
        else:
            prompts.append(prompt[-1]["content"])
            completions.append(completion["content"])
    args: dict[str, list] = {
        "prompts": prompts,
        "completions": completions,
        "completion_ids": [list(x.completion_ids) for x in inputs],
    }
    args["answer"] = [x.answer for x in inputs]
    for name in dict.fromkeys(k for x in inputs for k in x.columns):
        args.setdefault(name, [x.columns.get(name) for x in inputs])
    return args


def score_batched(spec: dict, fn: RewardFn, inputs: list[RewardInput]) -> list:
    """Per sample: the parts of one batched function, or its Failure for the whole chunk."""
    args = _batched_arguments(inputs)
    allowed = accepted_columns(fn)
    try:
        values = fn(**_call_kwargs(spec, allowed, args))
        if not isinstance(values, (list, tuple)) or len(values) != len(inputs):
            got = len(values) if isinstance(values, (list, tuple)) else type(values).__name__
            raise ValueError(f"returned {got}, expected a list of {len(inputs)} numbers")
        return [
            {} if v is None else _as_parts(part_name(spec), v, spec.get("range")) for v in values
        ]
    # a plug-in may raise anything; the chunk scores 0 for it
    except Exception as exc:
        return [_failure(part_name(spec), exc)] * len(inputs)


def score_chunk(specs: Sequence[dict], fns: Sequence[RewardFn], inputs: list[RewardInput]):
    """Yield each sample's Score in order: batched functions first (once), then per sample."""
    per_fn = [
        score_batched(spec, fn, inputs) if is_batched(spec, fn) else None
        for spec, fn in zip(specs, fns, strict=True)
    ]
    for j, x in enumerate(inputs):
        batched = [None if p is None else p[j] for p in per_fn]
        yield score_sample(specs, fns, x.messages, x.answer, x.columns, batched)


def _worker(conn, specs: list[dict], memory_mb: int) -> None:
    fns = [resolve(spec["fn"]) for spec in specs]
    with open("/proc/self/statm") as f:
        current = int(f.read().split()[0]) * resource.getpagesize()
    limit = current + (memory_mb << 20)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    # ready: the pool starts the per-sample clock only now, not while imports run
    conn.send(None)
    while True:
        try:
            chunk = conn.recv()
        except EOFError:
            return
        # one message per sample back, sent as each is scored: the pool's per-sample deadline
        # restarts with each, and a hang is pinned on the sample that hangs
        for score in score_chunk(specs, fns, chunk):
            conn.send(score)


# -- the pool ------------------------------------------------------------------------------------


class _Worker:
    def __init__(self, ctx, specs: list[dict], memory_mb: int) -> None:
        self.ready = False
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=_worker, args=(child, specs, memory_mb), daemon=True)
        self.process.start()
        child.close()

    def kill(self) -> None:
        self.process.kill()
        self.process.join(timeout=5)
        self.conn.close()


@dataclass
class _Job:
    """A chunk on a worker: the sample indices still unscored, in order, and the current deadline."""

    indices: list[int]
    deadline: float
    # batched functions run before the first result comes back
    batched_pending: bool


class RewardPool:
    """Scores samples in ``workers`` processes, one chunk per worker, each sample under a time limit."""

    def __init__(self, reward_cfg) -> None:
        self.specs = [spec.model_dump() for spec in reward_cfg.functions]
        for spec in self.specs:
            spec["range"] = spec["range"] or BUILTIN_REWARD_RANGES.get(spec["fn"])
            # the sandbox limits come from cfg.reward unless a spec overrides them
            if spec["fn"] == "code":
                spec["kwargs"] = {
                    "timeout_s": reward_cfg.sandbox_timeout_s,
                    "memory_mb": reward_cfg.sandbox_memory_mb,
                } | spec["kwargs"]
        check(reward_cfg)
        for spec in self.specs:
            # decided once here, so every worker scores a function in the same form
            spec["batched"] = is_batched(spec, resolve(spec["fn"]))
        self.has_batched = any(spec["batched"] for spec in self.specs)
        self.timeout_s = reward_cfg.timeout_s
        self.memory_mb = reward_cfg.worker_memory_mb
        self._ctx = multiprocessing.get_context("spawn")
        self._workers = [self._spawn() for _ in range(reward_cfg.workers)]

    def _spawn(self) -> _Worker:
        return _Worker(self._ctx, self.specs, self.memory_mb)

    def score(self, samples: Sequence) -> list[Score]:
        """Score samples (RewardInput or ``(messages, answer[, columns])``); failures score 0, counted."""
        inputs = [RewardInput.of(s) for s in samples]
        results: list[Score | None] = [None] * len(inputs)
        size = max(1, math.ceil(len(inputs) / len(self._workers)))
        chunks = [list(range(i, min(i + size, len(inputs)))) for i in range(0, len(inputs), size)]
        busy: dict[int, _Job] = {}
        while chunks or busy:
            for slot in range(len(self._workers)):
                if slot not in busy and chunks:
                    busy[slot] = self._start(slot, chunks.pop(0), inputs)
            wait_s = max(0.0, min(job.deadline for job in busy.values()) - time.monotonic())
            ready = multiprocessing.connection.wait(
                [self._workers[s].conn for s in busy], timeout=wait_s
            )
            for slot in list(busy):
                job, conn = busy[slot], self._workers[slot].conn
                if conn in ready:
                    try:
                        while job.indices and conn.poll():
                            message = conn.recv()
                            job.deadline = time.monotonic() + self.timeout_s
                            if message is None:
                                self._workers[slot].ready = True
                                continue
                            results[job.indices.pop(0)] = message
                            job.batched_pending = False
                    except (EOFError, OSError):
                        self._lose(slot, job, "crash", results, chunks)
                elif time.monotonic() >= job.deadline:
                    self._lose(slot, job, "timeout", results, chunks)
                if not job.indices:
                    del busy[slot]
        for result in results:
            kinds = [failure.kind for failure in result.failures.values()]
            # a lost worker is one failure of the sample, whatever number of functions it held
            for kind in [k for k in kinds if k not in WORKER_LOST] + sorted(
                WORKER_LOST.intersection(kinds)
            ):
                metrics.REWARD_FAILURES.labels(kind=kind).inc()
        return results

    def _start(self, slot: int, chunk: list[int], inputs: list[RewardInput]) -> _Job:
        payload = [inputs[i] for i in chunk]
        try:
            self._workers[slot].conn.send(payload)
        except (BrokenPipeError, OSError):
            self._replace(slot)
            self._workers[slot].conn.send(payload)
        startup = 0.0 if self._workers[slot].ready else STARTUP_S
        return _Job(list(chunk), time.monotonic() + self.timeout_s + startup, self.has_batched)

    def _lose(self, slot: int, job: _Job, kind: str, results: list, chunks: list) -> None:
        """The worker hung or died on the job's next sample: that sample (with batched rewards, the
        whole chunk, which they score together) scores 0; the rest goes to a fresh worker."""
        lost = job.indices if job.batched_pending else job.indices[:1]
        for index in lost:
            results[index] = self._failed(kind, index)
        rest = job.indices[len(lost) :]
        if rest:
            chunks.insert(0, rest)
        job.indices = []
        self._replace(slot)

    def _failed(self, kind: str, index: int) -> Score:
        """A sample the worker hung or died on: every function failed on it (which one is unknown)."""
        log.warning("reward worker %s on sample %d; it scores 0", kind, index)
        error = (
            f"the reward worker {'took longer than reward.timeout_s' if kind == 'timeout' else 'died'}"
            " on this sample"
        )
        return Score(0.0, failures={part_name(spec): Failure(kind, error) for spec in self.specs})

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
