"""Prompt datasets in every supported format, clear errors for malformed data, the shared order."""

from __future__ import annotations

import json

import pytest

from actors.demo_task import build_tokenizer
from actors.prompts import PromptDataError, PromptDataset, position

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
