"""The demo task's data and reward: distinct prompts, and a reward that sees every sampled token."""

from __future__ import annotations

import json

import numpy as np
import pytest

from streamrl.actors.demo_task import (
    EOS,
    PAD,
    build_tokenizer,
    distinct_examples,
    ensure_demo_dataset,
)
from streamrl.actors.engines.base import Output
from streamrl.actors.loop import assistant_turn
from streamrl.actors.rewards import resolve


def test_the_demo_dataset_holds_every_3_digit_prompt_once_in_a_seeded_order(tmp_path):
    rows = [json.loads(line) for line in ensure_demo_dataset(tmp_path / "a.jsonl").open()]
    prompts = [r["prompt"] for r in rows]
    assert len(prompts) == 1000 and len(set(prompts)) == 1000
    assert prompts != sorted(prompts)
    assert all(r["answer"] == r["prompt"][:3][::-1] for r in rows)
    # leading zeros are digits of the prompt
    assert "007>" in prompts
    again = [
        json.loads(line)["prompt"] for line in ensure_demo_dataset(tmp_path / "b.jsonl").open()
    ]
    other = [r["prompt"] for r in distinct_examples(1000, seed=1)]
    assert again == prompts and other != prompts
    small = [r["prompt"] for r in distinct_examples(200, seed=0)]
    assert len(set(small)) == 200
    with pytest.raises(ValueError, match="1000 distinct"):
        distinct_examples(1001)


def _reward(tokenizer, pieces: list[str], finish: str = "stop") -> float:
    ids = [tokenizer.convert_tokens_to_ids(p) for p in pieces]
    n = len(ids)
    output = Output(
        "r", np.array(ids, np.int32), np.zeros(n, np.float32), np.zeros(n, np.int32), finish
    )
    messages = [{"role": "user", "content": "314>"}, assistant_turn(tokenizer, output)]
    return sum(resolve("reverse_digits")(messages, "413").values())


def test_a_special_token_inside_the_answer_is_not_an_exact_match():
    tokenizer = build_tokenizer()
    assert _reward(tokenizer, ["4", "1", "3", EOS]) == pytest.approx(1.0)
    # the clean text of this completion is "413", exact before the reward saw special tokens
    assert _reward(tokenizer, ["4", PAD, "1", "3", EOS]) == pytest.approx(0.9 / 3)
    assert _reward(tokenizer, ["4", "1", "3", PAD], finish="length") == pytest.approx(0.9)
    assert _reward(tokenizer, ["4", "1", "3"], finish="length") == pytest.approx(0.9)
