"""The demo task (streamrl.examples.reverse_digits): its preset, data and rewards.

The preset names the demo's rewards as ``module:function`` and the paths ``streamrl example
demo`` makes, and trains with the values it trained with when they were the schema's defaults.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from streamrl.actors.engines.base import Output
from streamrl.actors.rewards import resolve, score_sample
from streamrl.actors.trajectory import assistant_turn
from streamrl.configs import load_config
from streamrl.examples.reverse_digits import reverse_digits, reverse_digits_exact, write_dataset
from streamrl.examples.reverse_digits.task import EOS, PAD, build_tokenizer, distinct_examples

DEMO = "configs/demo_cpu.yaml"


def test_the_demo_dataset_holds_every_3_digit_prompt_once_in_a_seeded_order(tmp_path):
    rows = [json.loads(line) for line in write_dataset(tmp_path / "a.jsonl").open()]
    prompts = [r["prompt"] for r in rows]
    assert len(prompts) == 1000 and len(set(prompts)) == 1000
    assert prompts != sorted(prompts)
    assert all(r["answer"] == r["prompt"][:3][::-1] for r in rows)
    # leading zeros are digits of the prompt
    assert "007>" in prompts
    again = [json.loads(line)["prompt"] for line in write_dataset(tmp_path / "b.jsonl").open()]
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
    return sum(reverse_digits(messages, "413").values())


def test_a_special_token_inside_the_answer_is_not_an_exact_match():
    tokenizer = build_tokenizer()
    assert _reward(tokenizer, ["4", "1", "3", EOS]) == pytest.approx(1.0)
    # the clean text of this completion is "413", exact before the reward saw special tokens
    assert _reward(tokenizer, ["4", PAD, "1", "3", EOS]) == pytest.approx(0.9 / 3)
    assert _reward(tokenizer, ["4", "1", "3", PAD], finish="length") == pytest.approx(0.9)
    assert _reward(tokenizer, ["4", "1", "3"], finish="length") == pytest.approx(0.9)


def turn(text: str, finish: str = "stop") -> list[dict]:
    return [{"role": "user", "content": "q"}, {"role": "assistant", "content": text, "finish_reason": finish}]  # fmt: skip


def test_reverse_digits_gives_one_only_for_the_exact_answer_then_stop():
    assert sum(reverse_digits(turn("413"), "413").values()) == pytest.approx(1.0)
    assert sum(reverse_digits(turn("413", "length"), "413").values()) == pytest.approx(0.9)
    assert sum(reverse_digits(turn("41"), "413").values()) == pytest.approx(0.6)


def test_the_demo_exact_match_is_one_only_where_the_shaped_reward_is_and_weighs_nothing():
    cases = [("413", "stop"), ("413", "length"), ("41", "stop"), ("4130", "stop"), ("314", "stop")]
    for text, finish in cases:
        shaped = sum(reverse_digits(turn(text, finish), "413").values())
        exact = reverse_digits_exact(turn(text, finish), "413")
        assert exact == float(shaped == pytest.approx(1.0)), (text, finish)
    specs = [spec.model_dump() for spec in load_config(DEMO, env={}).reward.functions]
    score = score_sample(specs, [resolve(s["fn"]) for s in specs], turn("413"), "413")
    assert score.total == pytest.approx(1.0) and score.parts["reverse_digits_exact"] == 1.0


def test_the_demo_preset_trains_with_the_values_it_had_when_they_were_the_defaults():
    cfg = load_config(DEMO, env={})
    assert (cfg.run.name, cfg.run.dir, cfg.run.target_parts) == (
        "demo",
        "runs/demo",
        {"reverse_digits_exact": 0.85},
    )
    assert (cfg.model.path, cfg.data.path) == ("runs/demo-policy", "runs/demo-data/train.jsonl")
    # 4 tokens since issue 24: the answer's 3 digits and the end of sequence, as the loop samples
    assert (cfg.rollout.max_new_tokens, cfg.learner.lr, cfg.learner.betas) == (4, 3e-4, (0.9, 0.99))
    # the parts keep the names the built-ins had: reverse_digits/position, reverse_digits_exact
    rewards = [(s.name, s.weight, resolve(s.fn)) for s in cfg.reward.functions]
    assert rewards == [
        ("reverse_digits", 1.0, reverse_digits),
        ("reverse_digits_exact", 0.0, reverse_digits_exact),
    ]


def test_streamrl_example_makes_the_demo_policy_and_data_once_and_keeps_them_after(
    tmp_path, capsys
):
    import stat

    from streamrl.examples.assets_cli import main
    from streamrl.policy.load import load_policy, load_tokenizer

    policy, data = tmp_path / "policy", tmp_path / "data" / "train.jsonl"
    before = os.umask(0o022)
    try:
        assert main(["demo", "--policy", str(policy), "--data", str(data)]) == 0
    finally:
        os.umask(before)
    said = capsys.readouterr().out.splitlines()
    assert said == [
        f"streamrl example: model.path {policy}: making demo's (seed 0)",
        f"streamrl example: data.path {data}: making demo's (seed 0)",
    ]
    assert load_policy(policy).config.num_hidden_layers == 2
    assert load_tokenizer(policy).convert_tokens_to_ids(EOS) is not None
    assert len(data.read_text().splitlines()) == 1000
    # whatever the umask: the user's only, as a run's files; no temporary name left beside them
    for path in (policy, policy / "config.json", data.parent, data):
        assert stat.S_IMODE(path.stat().st_mode) & 0o077 == 0, path
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "policy"]
    assert sorted(p.name for p in data.parent.iterdir()) == ["train.jsonl"]
    # a second call keeps what is there
    (data).write_text('{"prompt": "1>", "answer": "1"}\n')
    assert main(["demo", "--policy", str(policy), "--data", str(data), "--seed", "3"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"streamrl example: model.path {policy}: there already, kept",
        f"streamrl example: data.path {data}: there already, kept",
    ]
    assert data.read_text() == '{"prompt": "1>", "answer": "1"}\n'
