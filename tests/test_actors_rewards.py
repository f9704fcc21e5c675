"""Rewards: built-ins, plug-ins, weighting, and containment of rewards that misbehave."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest

from streamrl.actors import metrics
from streamrl.actors.rewards import RewardPool, resolve, score_sample
from streamrl.configs.schema import RewardConfig, RewardSpec

ROOT = Path(__file__).resolve().parents[1]
# the demo's shaped reward: 0.9 for the right digits, 0.1 for stopping right after them
SHAPED = "streamrl.examples.reverse_digits:reverse_digits"


def turn(text: str, finish: str = "stop") -> list[dict]:
    return [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": text, "finish_reason": finish},
    ]


def call(name: str, text: str, answer, **kwargs):
    return resolve(name)(turn(text), answer, **kwargs)


def test_the_core_has_no_demo_reward_and_imports_the_demo_only_when_a_config_names_it():
    with pytest.raises(ValueError, match="unknown reward 'reverse_digits'"):
        resolve("reverse_digits")
    code = (
        "import sys, streamrl.actors.rewards as r; "
        "assert not any(m.startswith('streamrl.examples') for m in sys.modules); "
        f"r.resolve({SHAPED!r}); assert 'streamrl.examples.reverse_digits' in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_a_spec_name_names_the_parts_in_place_of_fn():
    specs = [{"fn": SHAPED, "name": "shaped"}, {"fn": "exact_match", "name": "exact"}]
    score = score_sample(specs, [resolve(s["fn"]) for s in specs], turn("413"), "413")
    assert score.parts == pytest.approx({"shaped/position": 0.9, "shaped/stop": 0.1, "exact": 1.0})


def test_a_pool_without_reward_functions_fails_naming_the_key():
    with pytest.raises(ValueError, match="reward.functions is empty"):
        RewardPool(RewardConfig())


def test_exact_match_think_format_and_math_builtins():
    assert call("exact_match", " 42\n", "42") == 1.0 and call("exact_match", "43", "42") == 0.0
    assert call("think_format", "<think>reason</think> 42", None) == 1.0
    assert call("think_format", "42 <think>x</think>", None) == 0.0
    assert call("think_format", "<think></think>42", None) == 0.0
    assert call("math", "so the answer is $\\frac{1}{2}$", "0.5") == 1.0
    assert call("math", "the answer is $\\boxed{3}$", "4") == 0.0


def test_code_reward_runs_the_completion_against_tests_in_the_sandbox():
    solution = "Here:\n```python\ndef add(a, b):\n    return a + b\n```"
    assert call("code", solution, "assert add(2, 3) == 5") == 1.0
    assert call("code", solution, "assert add(2, 3) == 6") == 0.0
    echo = "```python\nprint(int(input()) * 2)\n```"
    cases = [
        {"input": "2", "output": "4"},
        {"input": "5", "output": "10"},
        {"input": "1", "output": "3"},
    ]
    assert call("code", echo, cases) == pytest.approx(2 / 3)
    assert call("code", "```python\nwhile True: pass\n```", "pass", timeout_s=1.0) == 0.0


def test_weighted_total_and_named_parts_from_builtins_and_plugins():
    specs = [
        {"fn": SHAPED, "name": "reverse_digits", "weight": 1.0},
        {"fn": "reward_plugins:length_parts", "weight": 0.5},
    ]
    score = score_sample(specs, [resolve(s["fn"]) for s in specs], turn("413"), "413")
    assert score.parts == pytest.approx(
        {
            "reverse_digits/position": 0.9,
            "reverse_digits/stop": 0.1,
            "reward_plugins:length_parts/chars": 0.3,
            "reward_plugins:length_parts/bonus": 0.5,
        }
    )
    assert score.total == pytest.approx(1.0 + 0.5 * 0.8) and not score.failures


def test_unknown_rewards_fail_before_anything_starts():
    with pytest.raises(ValueError, match="unknown reward 'nope'"):
        RewardPool(RewardConfig(functions=[RewardSpec(fn="nope")]))
    with pytest.raises(ValueError, match="cannot import"):
        RewardPool(RewardConfig(functions=[RewardSpec(fn="no_such_module_xyz:fn")]))
    with pytest.raises(ValueError, match="no callable"):
        RewardPool(RewardConfig(functions=[RewardSpec(fn="reward_plugins:missing")]))


def test_a_reward_file_that_does_not_parse_fails_at_start_naming_the_key_file_and_line(tmp_path):
    from streamrl.actors.rewards import check
    from streamrl.configs.errors import ConfigError

    bad = tmp_path / "my_reward.py"
    bad.write_text("def reward(messages, answer):\n    return (1.0\n")
    cfg = RewardConfig(functions=[RewardSpec(fn="exact_match"), RewardSpec(fn=f"{bad}:reward")])
    with pytest.raises(ConfigError) as caught:
        check(cfg)
    said = str(caught.value)
    assert said.startswith("reward.functions[1].fn: ") and f"{bad}:2: " in said
    assert "\n" not in said


def _failures(kind: str) -> float:
    return metrics.REWARD_FAILURES.labels(kind=kind)._value.get()


@pytest.mark.parametrize(
    ("plugin", "kind", "healthy_part_kept"),
    [
        ("raises", "exception", True),
        ("returns_nan", "invalid", True),
        ("returns_garbage", "invalid", True),
        ("hogs_memory", "memory", True),
        ("hangs", "timeout", False),
    ],
)
def test_a_misbehaving_reward_scores_zero_is_counted_and_the_pool_keeps_scoring(
    plugin, kind, healthy_part_kept
):
    cfg = RewardConfig(
        functions=[RewardSpec(fn=SHAPED), RewardSpec(fn=f"reward_plugins:{plugin}")],
        # only the hang is meant to meet the timeout: a memory hog on a loaded machine can take
        # longer than a second to reach its limit, and must still fail as "memory"
        timeout_s=1.0 if kind == "timeout" else 60.0,
        worker_memory_mb=256,
    )
    before = _failures(kind)
    with RewardPool(cfg) as pool:
        scores = pool.score([(turn("413"), "413"), (turn("413"), "413")])
        assert _failures(kind) == before + 2
        for score in scores:
            # a hung worker leaves unknown which function hung: every one failed on that sample
            assert {f.kind for f in score.failures.values()} == {kind}
            assert f"reward_plugins:{plugin}" in score.failures and math.isfinite(score.total)
            assert score.total == pytest.approx(1.0 if healthy_part_kept else 0.0)
        # the pool keeps working: a hung or crashed worker was replaced, the next call scores again
        again = pool.score([(turn("413"), "413")])[0]
        assert again.failures == scores[0].failures and again.total == scores[0].total


def _cfg(*specs: RewardSpec, **kwargs) -> RewardConfig:
    return RewardConfig(functions=list(specs), **kwargs)


def test_a_reward_given_as_a_file_path_sees_the_rows_columns_by_name(tmp_path, monkeypatch):
    (tmp_path / "my_reward.py").write_text(
        "def score(messages, answer, difficulty, source='none'):\n"
        "    return {'difficulty': float(difficulty), 'has_source': float(source != 'none')}\n"
    )
    monkeypatch.chdir(tmp_path)
    specs = [
        RewardSpec(fn="my_reward.py:score"),
        RewardSpec(fn="reward_plugins:uses_column", weight=2.0),
    ]
    with RewardPool(_cfg(*specs)) as pool:
        got = pool.score([(turn("1"), "1", {"difficulty": 3, "source": "gsm8k", "unused": 1})])[0]
    assert not got.failures
    assert got.parts == {
        "my_reward.py:score/difficulty": 3.0,
        "my_reward.py:score/has_source": 1.0,
        "reward_plugins:uses_column": 3.0,
    }
    assert got.total == pytest.approx(3.0 + 1.0 + 2 * 3.0)
    with pytest.raises(ValueError, match="no file"):
        resolve("missing_file.py:score")


def test_a_batched_reward_is_called_once_per_chunk_with_trl_arguments():
    specs = [RewardSpec(fn="reward_plugins:chunk_size", batched=True), RewardSpec(fn="exact_match")]
    samples = [(turn(str(i)), str(i % 2), {"level": i}) for i in range(6)]
    with RewardPool(_cfg(*specs)) as pool:
        scores = pool.score(samples)
    assert [s.parts["reward_plugins:chunk_size"] for s in scores] == [6.0] * 6
    assert [s.parts["exact_match"] for s in scores] == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0]
    with RewardPool(_cfg(*specs, workers=2)) as pool:
        scores = pool.score(samples)
    assert [s.parts["reward_plugins:chunk_size"] for s in scores] == [3.0] * 6


def test_in_a_chunk_a_sample_that_raises_or_hangs_scores_zero_alone():
    samples = [(turn("x"), answer) for answer in ("ok", "bad", "ok", "hang", "ok")]
    before = _failures("exception"), _failures("timeout")
    specs = [RewardSpec(fn="reward_plugins:picky"), RewardSpec(fn="reward_plugins:hangs_on_hang")]
    with RewardPool(_cfg(*specs, timeout_s=1.0)) as pool:
        scores = pool.score(samples)
    assert [s.total for s in scores] == [2.0, 1.0, 2.0, 0.0, 2.0]
    assert [sorted(f.kind for f in s.failures.values()) for s in scores] == [
        [],
        ["exception"],
        [],
        ["timeout", "timeout"],
        [],
    ]
    assert "this sample breaks the plug-in" in scores[1].failures["reward_plugins:picky"].error
    assert (_failures("exception"), _failures("timeout")) == (before[0] + 1, before[1] + 1)


def test_a_batched_reward_that_raises_scores_zero_for_its_chunk_only():
    specs = [
        RewardSpec(fn="reward_plugins:batched_raises", batched=True),
        RewardSpec(fn="exact_match"),
    ]
    with RewardPool(_cfg(*specs)) as pool:
        scores = pool.score([(turn("1"), "1"), (turn("2"), "3")])
    assert [s.total for s in scores] == [1.0, 0.0]
    assert all(list(s.failures) == ["reward_plugins:batched_raises"] for s in scores)
    assert scores[0].failures["reward_plugins:batched_raises"] == (
        "exception",
        "RuntimeError: batched plug-in bug",
    )


def test_a_workers_start_up_does_not_count_against_the_first_samples_time_limit():
    cfg = _cfg(RewardSpec(fn="slow_import_reward:one"), timeout_s=1.0)
    with RewardPool(cfg) as pool:
        scores = pool.score([(turn("1"), "1"), (turn("2"), "2")])
    assert [(s.total, s.failures) for s in scores] == [(1.0, {}), (1.0, {})]


def test_the_form_is_read_from_the_signature_and_trl_rewards_get_completion_ids():
    from streamrl.actors.rewards import RewardInput

    samples = [
        RewardInput(turn("ab"), "x", {"level": 1}, completion_ids=[5, 6, 7]),
        RewardInput(turn("c"), "y", {"level": 2}, completion_ids=[8]),
    ]
    specs = [
        # no `batched:` anywhere: TRL's signature is recognised
        RewardSpec(fn="reward_plugins:trl_lengths"),
        RewardSpec(fn="reward_plugins:takes_anything", name="per_sample"),
        RewardSpec(fn="reward_plugins:takes_anything", name="forced", batched=True),
    ]
    with RewardPool(_cfg(*specs)) as pool:
        scores = pool.score(samples)
    assert [s.failures for s in scores] == [{}, {}]
    assert [s.parts["reward_plugins:trl_lengths"] for s in scores] == [3.0, 1.0]
    assert [s.parts["per_sample"] for s in scores] == [2.0, 2.0]
    assert [s.parts["forced"] for s in scores] == [1.0, 1.0]


def test_gsm8k_is_a_built_in_that_reads_the_number_after_the_hashes():
    solution = "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n#### 1,072"
    with RewardPool(_cfg(RewardSpec(fn="gsm8k"))) as pool:
        scores = pool.score(
            [
                (turn("So she sold $\\boxed{1072}$ clips."), solution),
                (turn("She sold 24 clips."), solution),
                (turn("The answer is 7."), "7"),
            ]
        )
    assert [s.total for s in scores] == [1.0, 0.0, 1.0] and not any(s.failures for s in scores)


def test_a_groups_failures_travel_in_its_meta_and_give_each_functions_rate_per_step():
    from types import SimpleNamespace

    from streamrl.actors.rewards import Failure, Score, failure_meta
    from streamrl.learner.prepare import reward_failures_of

    broken = {"picky": Failure("exception", "KeyError: 'level'" + "!" * 1000)}
    group_a = [Score(0.0, failures=broken), Score(1.0), Score(0.0, failures=broken), Score(1.0)]
    group_b = [Score(1.0)] * 4
    deliveries = [
        SimpleNamespace(group=SimpleNamespace(completions=scores, meta=failure_meta(scores)))
        for scores in (group_a, group_b)
    ]
    rates, errors = reward_failures_of(deliveries, ["picky", "exact_match"])
    assert rates == {"picky": 2 / 8, "exact_match": 0.0}
    assert errors["picky"].startswith("KeyError: 'level'") and len(errors["picky"]) == 500
    # a hostile count is clamped, a malformed key ignored
    hostile = SimpleNamespace(
        group=SimpleNamespace(
            completions=[Score(0.0)] * 2, meta={"reward_failed/x": 10**9, "reward_error/x": 3}
        )
    )
    assert reward_failures_of([hostile]) == ({"x": 1.0}, {})
