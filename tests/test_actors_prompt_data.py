"""Prompt datasets in every supported format, clear errors for malformed data, the shared order."""

from __future__ import annotations

import json

import pytest

from streamrl.actors.prompt_data import PromptDataError, PromptDataset, position
from streamrl.examples.reverse_digits.task import build_tokenizer

ROWS = [
    {"prompt": "314>", "answer": "413"},
    {"prompt": "12>", "answer": "21"},
    {"prompt": "907>", "answer": "709"},
]


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


def _write(path, fmt: str, rows=ROWS):
    import datasets

    if fmt == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif fmt == "json":
        path.write_text(json.dumps(rows))
    elif fmt == "csv":
        datasets.Dataset.from_list(rows).to_csv(str(path), index=False)
    elif fmt == "parquet":
        datasets.Dataset.from_list(rows).to_parquet(str(path))
    elif fmt == "arrow":
        import pyarrow as pa

        table = pa.Table.from_pylist(rows)
        with pa.ipc.new_stream(str(path), table.schema) as writer:
            writer.write_table(table)
    elif fmt == "folder":
        datasets.DatasetDict({"train": datasets.Dataset.from_list(rows)}).save_to_disk(str(path))
    return path


@pytest.mark.parametrize("fmt", ["jsonl", "json", "csv", "parquet", "arrow", "folder"])
def test_every_supported_format_loads_and_tokenizes(tmp_path, tokenizer, fmt):
    path = _write(tmp_path / (f"data.{fmt}" if fmt != "folder" else "saved"), fmt)
    dataset = PromptDataset(path, tokenizer)
    assert len(dataset) == 3 and dataset.format == "prompt"
    first = dataset.get(0)
    assert first.token_ids == tokenizer("314>")["input_ids"]
    assert first.messages == [{"role": "user", "content": "314>"}] and str(first.answer) == "413"


def test_rl2_messages_are_rendered_with_the_chat_template(tmp_path, tokenizer):
    rows = [
        {
            "messages": [
                {"role": "system", "content": "reverse"},
                {"role": "user", "content": "314>"},
            ],
            "answer": "413",
        }
    ]
    dataset = PromptDataset(_write(tmp_path / "m.jsonl", "jsonl", rows), tokenizer)
    assert dataset.format == "messages"
    text = tokenizer.decode(dataset.get(0).token_ids)
    assert (
        text
        == "<|im_start|>system\nreverse<|im_end|>\n<|im_start|>user\n314><|im_end|>\n<|im_start|>assistant\n"
    )


def test_prompt_rows_can_be_rendered_as_one_user_turn(tmp_path, tokenizer):
    dataset = PromptDataset(_write(tmp_path / "p.jsonl", "jsonl"), tokenizer, chat_template=True)
    assert tokenizer.decode(dataset.get(0).token_ids).startswith("<|im_start|>user\n314>")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (
            '{"prompt": "1>", "answer": "1"}\n{"prompt": "2>", "answer": \n',
            r"row 2: not valid JSON",
        ),
        ('{"prompt": "1>", "answer": "1"}\n[1, 2]\n', r"row 2: expected a JSON object"),
        (
            '{"prompt": "1>", "answer": "1"}\n{"prompt": "", "answer": "2"}\n',
            r"row 2, column 'prompt': expected a non-empty string",
        ),
        ('{"prompt": "1>"}\n', r"missing \['answer'\]"),
        ('{"question": "1>", "answer": "1"}\n', r"format 'prompt' needs columns"),
        (
            '{"messages": [{"role": "user", "content": "1>"}], "answer": "1"}\n{"messages": [{"role": "user"}], "answer": "2"}\n',
            r"row 2, column 'messages': expected \{role, content\}",
        ),
        ('{"prompt": "1>", "answer": null}\n', r"row 1, column 'answer': missing value"),
    ],
    ids=[
        "bad_json",
        "not_an_object",
        "empty_prompt",
        "no_answer_column",
        "no_prompt_column",
        "bad_message",
        "null_answer",
    ],
)
def test_malformed_data_is_a_clear_error_naming_file_row_and_column(
    tmp_path, tokenizer, content, message
):
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    with pytest.raises(PromptDataError, match=message) as info:
        PromptDataset(path, tokenizer)
    assert str(path) in str(info.value)


def test_missing_unknown_or_empty_datasets_are_clear_errors(tmp_path, tokenizer):
    with pytest.raises(PromptDataError, match="does not exist"):
        PromptDataset(tmp_path / "nope.jsonl", tokenizer)
    (tmp_path / "data.txt").write_text("x")
    with pytest.raises(PromptDataError, match="unknown file type"):
        PromptDataset(tmp_path / "data.txt", tokenizer)
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(PromptDataError, match="empty.jsonl"):
        PromptDataset(tmp_path / "empty.jsonl", tokenizer)
    folder = _write(tmp_path / "saved", "folder")
    with pytest.raises(PromptDataError, match="no split 'test'"):
        PromptDataset(folder, tokenizer, split="test")


def test_cursor_positions_visit_every_row_once_per_epoch_in_a_new_order():
    size = 7
    epochs = [
        [position(c, size, seed=3) for c in range(e * size, (e + 1) * size)] for e in range(3)
    ]
    for e, taken in enumerate(epochs):
        assert {epoch for epoch, _ in taken} == {e}
        assert sorted(row for _, row in taken) == list(range(size))
    assert len({tuple(row for _, row in taken) for taken in epochs}) > 1


def test_mapped_columns_and_every_other_column_of_the_row(tmp_path, tokenizer):
    rows = [{"question": "314>", "solution": "413", "level": 2, "source": "demo"}]
    path = _write(tmp_path / "q.jsonl", "jsonl", rows)
    dataset = PromptDataset(path, tokenizer, prompt_key="question", answer_key="solution")
    prompt = dataset.get(0)
    assert dataset.format == "prompt" and prompt.token_ids == tokenizer("314>")["input_ids"]
    assert prompt.answer == "413"
    assert prompt.columns == {"question": "314>", "solution": "413", "level": 2, "source": "demo"}
    with pytest.raises(PromptDataError, match=r"missing \['answer'\]"):
        PromptDataset(path, tokenizer, prompt_key="question")
    assert (
        PromptDataset(path, tokenizer, prompt_key="question", answer_key=None).get(0).answer is None
    )


def test_apply_chat_template_false_is_honoured_for_messages_rows(tmp_path, tokenizer):
    turns = [{"role": "system", "content": "reverse"}, {"role": "user", "content": "314>"}]
    path = _write(tmp_path / "m.jsonl", "jsonl", [{"messages": turns, "answer": "413"}])
    dataset = PromptDataset(path, tokenizer, chat_template=False)
    assert dataset.format == "messages"
    assert tokenizer.decode(dataset.get(0).token_ids) == "reverse\n314>"
    assert "<|im_start|>" in tokenizer.decode(PromptDataset(path, tokenizer).get(0).token_ids)


HUB_README = """---
configs:
- config_name: easy
  data_files:
  - split: train
    path: easy/train.jsonl
  - split: test
    path: easy/test.jsonl
- config_name: hard
  data_files:
  - split: train
    path: hard/train.jsonl
---
"""

HUB_CHILD = """
import json, sys
from streamrl.examples.reverse_digits.task import build_tokenizer
from streamrl.actors.prompt_data import PromptDataError, PromptDataset
from streamrl.configs.schema import DataConfig
tokenizer = build_tokenizer()
out = {}
for config, split in (("easy", "train"), ("easy", "test"), ("hard", "train")):
    cfg = DataConfig(path="org/toy-math", config=config, split=split, prompt_key="question",
                     answer_key="solution")
    d = PromptDataset.from_config(cfg, tokenizer)
    out[f"{config}/{split}"] = [d.get(i).columns for i in range(len(d))]
try:
    PromptDataset.from_config(DataConfig(path="org/not-cached"), tokenizer)
except PromptDataError as exc:
    out["missing"] = str(exc)
print(json.dumps(out))
"""


def test_a_hub_dataset_loads_by_name_config_and_split_from_the_hub_cache_offline(tmp_path):
    import os
    import subprocess
    import sys

    from tests.hub_cache import add_to_cache, hub_env

    repo = tmp_path / "repo"
    for config, split, rows in (
        ("easy", "train", [{"question": "12>", "solution": "21"}, {"question": "34>", "solution": "43"}]),
        ("easy", "test", [{"question": "56>", "solution": "65"}]),
        ("hard", "train", [{"question": "789>", "solution": "987"}]),
    ):  # fmt: skip
        (repo / config).mkdir(parents=True, exist_ok=True)
        _write(repo / config / f"{split}.jsonl", "jsonl", rows)
    (repo / "README.md").write_text(HUB_README)
    cache = tmp_path / "hf"
    add_to_cache(cache, "org/toy-math", repo, kind="dataset")
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(hub_env(cache), PYTHONPATH=os.getcwd(), HF_DATASETS_CACHE=str(tmp_path / "ds"))
    done = subprocess.run(
        [sys.executable, "-c", HUB_CHILD], env=env, capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert [r["solution"] for r in got["easy/train"]] == ["21", "43"]
    assert got["easy/test"] == [{"question": "56>", "solution": "65"}]
    assert got["hard/train"] == [{"question": "789>", "solution": "987"}]
    assert "org/not-cached" in got["missing"] and "no hub dataset" in got["missing"]


# a template that reads a keyword, as Qwen3's reads enable_thinking
THINKING = (
    "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    "{% if enable_thinking is defined and not enable_thinking %}0{% else %}1{% endif %}"
)


def test_chat_template_kwargs_reach_every_chat_template_rendering(tmp_path):
    from streamrl.actors.agent_recorder import Recorder
    from streamrl.actors.trajectory import Renderer
    from streamrl.configs import load_config

    tokenizer = build_tokenizer()
    tokenizer.chat_template = THINKING
    off = load_config(None, ["rollout.chat_template_kwargs={enable_thinking: false}"], env={})
    kwargs = off.rollout.chat_template_kwargs
    assert kwargs == {"enable_thinking": False}
    path = _write(tmp_path / "p.jsonl", "jsonl")

    def last(ids):
        return tokenizer.decode(ids[-1:])

    prompts = PromptDataset(path, tokenizer, chat_template=True, template_kwargs=kwargs)
    assert last(prompts.get(0).token_ids) == "0"
    assert last(PromptDataset(path, tokenizer, chat_template=True).get(0).token_ids) == "1"
    turn = [{"role": "user", "content": "12>"}]
    # multi-turn environments and the agent server render through Renderer
    assert last(Renderer(tokenizer, (), kwargs).prompt(turn)) == "0"
    assert last(Renderer(tokenizer).prompt(turn)) == "1"
    recorder = Recorder(tokenizer, 2, 64, 128, 64, kwargs)
    plan = recorder.chat(recorder.open_group(None).trajectories[0], turn, None, 4)
    assert last(plan.prompt) == "0"
