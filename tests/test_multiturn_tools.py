"""Tools run in processes a timed-out step kills, and a turn's environment steps run
concurrently up to ``env.max_concurrent_steps``: hung tools neither pile up nor serialize."""

from __future__ import annotations

import os
import threading
import time

import pytest

from streamrl.actors import environment
from streamrl.actors.environment import EnvFailure, Step, ToolEnvironment
from streamrl.actors.sources.environment import Rollouts
from streamrl.actors.trajectory import Trajectory
from streamrl.configs.schema import EnvConfig


def hang(path: str) -> str:
    """Write this process's id to ``path``, then never answer."""
    with open(path, "w") as f:
        f.write(str(os.getpid()))
    time.sleep(3600)
    return "never"


def echo(text: str) -> str:
    """Answer ``text``."""
    return text


class Tools(ToolEnvironment):
    tools = [hang, echo]

    def reset(self, row):
        return [{"role": "user", "content": "go"}]


def _env_step_threads() -> int:
    return sum(t.name == "env-step" and t.is_alive() for t in threading.enumerate())


def test_a_timed_out_tool_is_killed_and_its_step_ends(tmp_path):
    pid_file = tmp_path / "pid"
    before = _env_step_threads()
    turn = {"tool_calls": [{"name": "hang", "arguments": {"path": str(pid_file)}}]}
    with pytest.raises(EnvFailure, match="timeout"):
        environment.call(Tools().step, turn, 1.0)
    # the step's thread is not left behind (call waits for it, at most STOP_WAIT_S)
    assert _env_step_threads() == before
    if pid_file.exists():
        pid = int(pid_file.read_text())
        assert pid != os.getpid()
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_tools_answer_from_their_process():
    calls = [
        {"name": "echo", "arguments": {"text": "hi"}},
        {"name": "echo", "arguments": {"wrong": 1}},
    ]
    step = Tools().step({"tool_calls": calls})
    assert step.messages[0]["content"] == "hi"
    assert step.messages[1]["content"].startswith("error:")
    assert step.tool_failures == ["bad_arguments"]


class Meets:
    """An environment whose step returns once ``party`` steps are in it at once."""

    def __init__(self, barrier: threading.Barrier, seen: dict) -> None:
        self.barrier, self.seen = barrier, seen

    def step(self, turn):
        with self.seen["lock"]:
            self.seen["now"] += 1
            self.seen["peak"] = max(self.seen["peak"], self.seen["now"])
        # a bound on failure only: sequential steps never meet
        self.barrier.wait(timeout=60)
        with self.seen["lock"]:
            self.seen["now"] -= 1
        return Step(reward=1.0, done=True)


@pytest.mark.parametrize("limit", [2, 4])
def test_a_turns_steps_run_concurrently_up_to_the_limit(limit):
    seen = {"lock": threading.Lock(), "now": 0, "peak": 0}
    barrier = threading.Barrier(limit)
    cfg = EnvConfig(step_timeout_s=120, max_concurrent_steps=limit)
    rollouts = Rollouts(cfg, None, None, None)
    batch = [Trajectory(Meets(barrier, seen), [1], []) for _ in range(4)]
    turns = [{"tool_calls": []} for _ in batch]
    steps = rollouts._steps(batch, turns)
    assert all(isinstance(s, Step) for s in steps), steps
    assert seen["peak"] == limit
