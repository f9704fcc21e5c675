"""The "Write your own task" walkthrough (docs/own_task.md) and the GPU recipe hold together."""

from __future__ import annotations

import pytest

from streamrl.actors.prompt_data import PromptDataset
from streamrl.actors.rewards import RewardInput, RewardPool
from streamrl.configs import load_config
from streamrl.examples.reverse_digits.task import build_tokenizer


def _answer(text: str, finish: str = "stop") -> dict:
    return {"role": "assistant", "content": text, "finish_reason": finish}


def test_the_copy_task_config_loads_its_data_and_scores_with_both_reward_forms():
    cfg = load_config("examples/copy_task/config.yaml")
    dataset = PromptDataset.from_config(cfg.data, build_tokenizer())
    assert len(dataset) == 500 and dataset.format == "prompt"
    prompt = dataset.get(0)
    assert prompt.messages[0]["content"] == prompt.answer + ">"
    assert prompt.columns["length"] == len(prompt.answer)
    held_out = PromptDataset.from_config(cfg.data, build_tokenizer(), held_out=True)
    assert len(held_out) == 50 and held_out.prompt_key == "question"
    right = RewardInput(
        prompt.messages + [_answer(prompt.answer)], prompt.answer, prompt.columns, False
    )
    wrong = RewardInput(prompt.messages + [_answer("9" * 6, "length")], prompt.answer, prompt.columns, False)  # fmt: skip
    with RewardPool(cfg.reward) as pool:
        good, bad = pool.score([right, wrong])
    assert not good.failures and not bad.failures
    assert good.total == pytest.approx(1.0 + 0.5)
    assert bad.total < 0.9 and bad.parts["examples/copy_task/reward.py:exact_batch"] == 0.0


def test_the_gpu_gsm8k_recipe_validates_and_its_reward_reads_gsm8k_solutions():
    cfg = load_config("configs/gpu_gsm8k_qwen05b.yaml")
    assert cfg.model.path == "Qwen/Qwen2.5-0.5B-Instruct"
    assert (cfg.data.path, cfg.data.config, cfg.data.prompt_key) == (
        "openai/gsm8k",
        "main",
        "question",
    )
    solution = "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n#### 1,072"
    samples = [
        (
            [{"role": "user", "content": "q"}, _answer("So she sold $\\boxed{1072}$ clips.")],
            solution,
        ),
        ([{"role": "user", "content": "q"}, _answer("She sold 24 clips.")], solution),
    ]
    with RewardPool(cfg.reward.model_copy(update={"workers": 1})) as pool:
        scores = pool.score(samples)
    assert [s.total for s in scores] == [1.0, 0.0]
