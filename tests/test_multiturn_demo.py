"""The multi-turn demo's environment: its feedback, its reward over two attempts, the turn-2
reward part and the warm start's two-turn examples."""

from __future__ import annotations

import random

import pytest

from streamrl.examples.multiturn import SecondAttempt, feedback, hint, second_turn_exact
from streamrl.examples.multiturn.env import make_two_turn_example
from streamrl.examples.reverse_digits.task import EOS, IM_END

ROW = {"messages": [{"role": "user", "content": "314>"}], "answer": "413"}


def _turn(text: str) -> dict:
    return {"role": "assistant", "content": text.removesuffix(EOS), "raw_content": text}


def test_feedback_masks_the_wrong_digits_and_asks_again():
    assert hint("413", "493") == "4?3"
    assert hint("413", "41") == "41?"
    assert feedback("314>", "413", "493") == "4?3:314>"


def test_right_at_once_scores_full_and_ends():
    env = SecondAttempt()
    assert env.reset(dict(ROW)) == ROW["messages"]
    step = env.step(_turn("413" + EOS))
    assert step.done and step.reward == pytest.approx(1.0)


def test_a_second_attempt_scores_the_mean_of_both():
    env = SecondAttempt()
    env.reset(dict(ROW))
    first = env.step(_turn("493" + EOS))
    # two digits right and a stop: (0.9 * 2/3 + 0.1) / 2
    assert not first.done and first.reward == pytest.approx(0.35)
    assert first.messages == [{"role": "user", "content": "4?3:314>"}]
    second = env.step(_turn("413" + EOS))
    assert second.done and second.reward == pytest.approx(0.5)
    assert first.reward + second.reward == pytest.approx(0.85)


def test_second_turn_exact_counts_only_a_right_second_attempt():
    question = [{"role": "user", "content": "314>"}]
    again = {"role": "user", "content": "4?3:314>"}
    assert second_turn_exact(question + [_turn("413" + EOS)], "413") == 0.0
    assert (
        second_turn_exact(question + [_turn("493" + EOS), again, _turn("413" + EOS)], "413") == 1.0
    )
    assert (
        second_turn_exact(question + [_turn("493" + EOS), again, _turn("433" + EOS)], "413") == 0.0
    )


def test_the_warm_start_sees_both_turns_contexts():
    rng = random.Random(0)
    examples = [make_two_turn_example(rng) for _ in range(200)]
    second = [e for e in examples if IM_END in e["prompt"]]
    assert 50 < len(second) < 150
    for e in second:
        question, rest = e["prompt"].split(">", 1)
        attempt, shown = rest.split(EOS + IM_END)
        assert shown == feedback(question + ">", e["answer"], attempt)
