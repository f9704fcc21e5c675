"""What multi-turn trajectories did, from the actor to the learner's step row: turns, tool calls
and their failures by reason, environment step time and ends, counted per trajectory, carried
in the wire's ``env`` map (validated against hostile entries) and summarized per step."""

from __future__ import annotations

import math

import msgpack
import numpy as np
import pytest
from multiturn_envs import env_rollouts, lookup, terse_tokenizer

from streamrl.actors.engines.base import Output
from streamrl.actors.environment import Step, ToolEnvironment
from streamrl.actors.trajectory import group_stats
from streamrl.broker import env_stats
from streamrl.broker.wire import Completion, RolloutGroup, WireError, decode_group, encode_group

ROW = {"messages": [{"role": "user", "content": "1>"}], "answer": "42"}


class _Lookup(ToolEnvironment):
    tools = [lookup]

    def reset(self, row):
        return row["messages"]

    def answer(self, turn):
        return Step(reward=1.0, done=True)


@pytest.fixture(scope="module")
def tokenizer(demo_policy):
    tokenizer = terse_tokenizer(demo_policy)
    return tokenizer


def _turn(tokenizer, text: str) -> Output:
    """A model turn as the engine returns it: ``text``'s tokens, then the stop token."""
    ids = tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id]
    n = len(ids)
    ids = np.asarray(ids, np.int32)
    return Output("0", ids, np.zeros(n, np.float32), np.zeros(n, np.int32), "stop")


def test_tool_calls_and_their_failures_are_counted_by_reason_with_the_step_time(tokenizer):
    rollouts = env_rollouts(tokenizer, _Lookup, max_turns=4, max_total_tokens=400)
    group = rollouts.start_group(ROW, 2)
    first, second = group
    turns = [
        # one good call, one unknown tool, one that is not JSON
        '<tool_call>{"name":"lookup","arguments":{"key":"a"}}</tool_call>'
        '<tool_call>{"name":"nope","arguments":{}}</tool_call><tool_call>{x}</tool_call>',
        # arguments that do not fit
        '<tool_call>{"name":"lookup","arguments":{"k":1}}</tool_call>',
        "42",
    ]
    for text in turns:
        rollouts._after_turns([first], [_turn(tokenizer, text)])
    # a tool that raises ends its trajectory with error
    rollouts._after_turns([second], [_turn(tokenizer, '<tool_call>{"name":"lookup","arguments":{"key":"b"}}</tool_call>')])  # fmt: skip
    assert (first.end, first.turns, first.steps, first.tool_calls) == ("done", 3, 3, 4)
    assert first.tool_failed == {"parse": 1, "unknown_tool": 1, "bad_arguments": 1}
    assert (second.end, second.turns, second.steps, second.tool_calls) == ("error", 1, 1, 1)
    assert second.tool_failed == {"raised": 1}
    assert first.step_s > 0 and second.step_s > 0
    stats = group_stats(group)
    assert {k: v for k, v in stats.items() if k != "step_s"} == {
        "turns": 4,
        "steps": 4,
        "tool_calls": 5,
        "tool_failed/parse": 1,
        "tool_failed/unknown_tool": 1,
        "tool_failed/bad_arguments": 1,
        "tool_failed/raised": 1,
        "end/done": 1,
        "end/error": 1,
    }
    assert stats["step_s"] == first.step_s + second.step_s


def test_an_environment_reporting_an_unknown_tool_failure_is_invalid(tokenizer):
    class Liar:
        def reset(self, row):
            return row["messages"]

        def step(self, turn):
            return Step(messages=[{"role": "user", "content": "x"}], tool_failures=["oops"])

    rollouts = env_rollouts(tokenizer, Liar)
    (t,) = rollouts.start_group(ROW, 1)
    rollouts._after_turns(
        [t], [_turn(tokenizer, '<tool_call>{"name":"x","arguments":{}}</tool_call>')]
    )
    assert t.end == "invalid" and t.tool_failed == {} and t.steps == 1


def test_an_environment_reporting_more_failures_than_calls_is_invalid(tokenizer):
    class Inflates:
        def reset(self, row):
            return row["messages"]

        def step(self, turn):
            return Step(
                messages=[{"role": "user", "content": "x"}], tool_failures=["unknown_tool"] * 2
            )

    rollouts = env_rollouts(tokenizer, Inflates)
    (t,) = rollouts.start_group(ROW, 1)
    rollouts._after_turns(
        [t], [_turn(tokenizer, '<tool_call>{"name":"x","arguments":{}}</tool_call>')]
    )
    assert t.end == "invalid" and t.tool_calls == 1 and t.tool_failed == {}


def _group(env: dict, n: int = 2) -> RolloutGroup:
    completions = [
        Completion(
            np.arange(3, dtype=np.int32), np.zeros(3, np.float32), np.zeros(3, np.int32), 0.0
        )
        for _ in range(n)
    ]
    return RolloutGroup("g", "p", "a", 0, np.array([1], np.int32), completions, env=env)


STATS = {"turns": 3, "steps": 3, "step_s": 0.25, "tool_calls": 2, "tool_failed/parse": 1,
         "end/done": 1, "end/max_turns": 1}  # fmt: skip


def test_env_stats_round_trip_and_single_turn_entries_carry_none():
    decoded = decode_group(encode_group(_group(STATS)))
    assert decoded.env == STATS
    plain = encode_group(_group({}))
    assert b"env" not in plain and decode_group(plain).env == {}


def _forged(env) -> bytes:
    obj = msgpack.unpackb(encode_group(_group({})))
    obj["env"] = env
    return msgpack.packb(obj)


@pytest.mark.parametrize(
    ("env", "match"),
    [
        ([1, 2], "expected a map"),
        ({**STATS, "secret": 1}, "unknown key 'secret'"),
        ({**STATS, "x" * 10_000: 1}, "unknown key"),
        ({**STATS, "turns": "3"}, "turns: expected a number"),
        ({**STATS, "turns": True}, "turns: expected a number"),
        ({**STATS, "turns": -1}, "not a finite number >= 0"),
        ({**STATS, "step_s": math.nan}, "not a finite number >= 0"),
        ({**STATS, "step_s": math.inf}, "not a finite number >= 0"),
        ({**STATS, "turns": 1.5}, "not a whole count"),
        ({**STATS, "tool_calls": 2.0**40}, "not a whole count"),
        ({**STATS, "end/done": 5}, "ends add up to 6, the group has 2 completions"),
        ({"turns": 2}, "ends add up to 0"),
    ],
)
def test_the_wire_rejects_forged_env_stats(env, match):
    with pytest.raises(WireError, match=match):
        decode_group(_forged(env))


def test_the_actor_cannot_publish_stats_that_do_not_fit_its_group():
    with pytest.raises(WireError, match="ends add up to 2, the group has 3"):
        encode_group(_group(STATS, n=3))


def _summary_by_hand(groups):
    """Per trajectory, from the groups' stats one at a time."""
    n = sum(size for stats, size in groups if stats)
    total = {}
    for stats, _ in groups:
        for key, value in stats.items():
            total[key] = total.get(key, 0.0) + value
    out = {"turns": total.get("turns", 0) / n, "tool_calls": total.get("tool_calls", 0) / n}
    for reason in env_stats.TOOL_FAILURES:
        out[f"tool_failed/{reason}"] = total.get(f"tool_failed/{reason}", 0) / n
    out["step_s"] = total["step_s"] / total["steps"]
    for reason in env_stats.END_REASONS:
        out[f"end/{reason}"] = total.get(f"end/{reason}", 0) / n
    return out


def test_a_steps_summary_is_per_trajectory_over_its_multiturn_groups():
    other = {"turns": 4, "steps": 3, "step_s": 0.5, "tool_calls": 0, "end/error": 2, "end/done": 2}
    groups = [(STATS, 2), (other, 4), ({}, 8)]
    summary = env_stats.summarize(groups)
    assert summary == pytest.approx(_summary_by_hand(groups))
    assert summary["turns"] == pytest.approx(7 / 6) and summary["end/done"] == pytest.approx(3 / 6)
    assert summary["step_s"] == pytest.approx(0.75 / 6)
    # no multi-turn group: no entry; no step call: 0 s, not a division by zero
    assert env_stats.summarize([({}, 8)]) == {}
    assert env_stats.summarize([({"end/timeout": 1}, 1)])["step_s"] == 0.0


def test_the_live_line_shows_turns_tool_calls_their_failures_and_the_step_time():
    from streamrl.launch.status import Snapshot
    from streamrl.launch.view import plain_line

    env = env_stats.summarize([(STATS, 2)])
    line = plain_line(Snapshot(at=0.0, version=1, last_step={"reward_mean": 0.5, "env": env}), 1.0)
    # 3 turns and 2 tool calls over 2 trajectories, 1 of the 2 calls failed, 0.25 s over 3 steps
    assert "turns=1.50 tools=1.00 tools_failed=50% env_step=83.3ms " in line
