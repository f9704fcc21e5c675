"""Prompt datasets and the prompt order all actors share.

Loading: JSONL, JSON, Parquet, CSV and Arrow files and saved HF dataset folders,
through the ``datasets`` library. Rows are either RL2-style ``messages`` (a list
of ``{role, content}``) + ``answer``, or ``prompt`` (a string) + ``answer``.
Every row is validated and tokenized at load time, so malformed data fails
before anything starts, with the file, row and column named.

Order: one Redis counter (``prompts:cursor``) is INCRed per prompt taken. Value
``c`` maps to epoch ``c // size`` and to row ``permutation(seed + epoch)[c % size]``:
actors can join or leave at any time, and no two actors get the same prompt
within an epoch.
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

_FILE_BUILDERS = {
    ".jsonl": "json",
    ".json": "json",
    ".parquet": "parquet",
    ".csv": "csv",
    ".arrow": "arrow",
}


class PromptDataError(ValueError):
    """A dataset that cannot be used; the message names the file, row and column."""


@dataclass
class Prompt:
    index: int  # row in the dataset
    epoch: int
    token_ids: list[int]
    messages: list[dict[str, str]]  # the conversation before the completion
    answer: Any

    @property
    def prompt_id(self) -> str:
        return f"row{self.index}"


def _load_table(path: Path, split: str):
    import datasets

    datasets.disable_progress_bars()
    if path.is_dir():
        try:
            loaded = datasets.load_from_disk(str(path))
        except (FileNotFoundError, ValueError) as exc:
            raise PromptDataError(
                f"{path}: not a saved Hugging Face dataset folder: {exc}"
            ) from None
        if isinstance(loaded, datasets.DatasetDict):
            if split not in loaded:
                raise PromptDataError(f"{path}: no split {split!r} (has {sorted(loaded)})")
            loaded = loaded[split]
        return loaded
    builder = _FILE_BUILDERS.get(path.suffix.lower())
    if builder is None:
        raise PromptDataError(
            f"{path}: unknown file type {path.suffix!r}; expected one of {sorted(_FILE_BUILDERS)}"
        )
    if builder == "json":
        _check_json_lines(path)
    try:
        return datasets.load_dataset(builder, data_files=str(path), split="train")
    except Exception as exc:  # datasets wraps parser errors in several types
        cause = exc.__cause__ or exc
        raise PromptDataError(
            f"{path}: cannot read as {builder}: {type(cause).__name__}: {cause}"
        ) from None


def _check_json_lines(path: Path) -> None:
    """Name the first bad line of a JSONL file (datasets' own error does not)."""
    if path.suffix.lower() != ".jsonl":
        try:
            json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise PromptDataError(f"{path}: not valid JSON: {exc}") from None
        return
    with open(path) as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise PromptDataError(f"{path}: row {number}: not valid JSON: {exc.msg}") from None
            if not isinstance(row, dict):
                raise PromptDataError(
                    f"{path}: row {number}: expected a JSON object, got {type(row).__name__}"
                )


def _pick_format(columns: list[str], wanted: str, path: Path) -> str:
    if wanted == "auto":
        wanted = "messages" if "messages" in columns else "prompt"
    needed = [wanted, "answer"]
    missing = [c for c in needed if c not in columns]
    if missing:
        raise PromptDataError(
            f"{path}: format {wanted!r} needs columns {needed}; missing {missing} (has {columns})"
        )
    return wanted


def _messages(row: dict, fmt: str, where: str) -> list[dict[str, str]]:
    if fmt == "prompt":
        prompt = row["prompt"]
        if not isinstance(prompt, str) or not prompt:
            raise PromptDataError(
                f"{where}, column 'prompt': expected a non-empty string, got {prompt!r:.80}"
            )
        return [{"role": "user", "content": prompt}]
    messages = row["messages"]
    if not isinstance(messages, list) or not messages:
        raise PromptDataError(
            f"{where}, column 'messages': expected a non-empty list, got {messages!r:.80}"
        )
    for turn in messages:
        if (
            not isinstance(turn, dict)
            or not isinstance(turn.get("role"), str)
            or not isinstance(turn.get("content"), str)
        ):
            raise PromptDataError(
                f"{where}, column 'messages': expected {{role, content}} strings, got {turn!r:.80}"
            )
    return [{"role": t["role"], "content": t["content"]} for t in messages]


def _render(messages: list[dict[str, str]], fmt: str, tokenizer, chat_template: bool) -> list[int]:
    if chat_template or fmt == "messages":
        if not getattr(tokenizer, "chat_template", None):
            raise PromptDataError("rendering messages needs a tokenizer with a chat template")
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)
    return tokenizer(messages[0]["content"], add_special_tokens=True)["input_ids"]


class PromptDataset:
    """All rows, validated and tokenized. ``fmt``: auto | messages | prompt (see cfg.data)."""

    def __init__(
        self,
        path: str | os.PathLike,
        tokenizer,
        fmt: str = "auto",
        split: str = "train",
        chat_template: bool = False,
    ):
        path = Path(path)
        if not path.exists():
            raise PromptDataError(f"{path}: dataset does not exist")
        table = _load_table(path, split)
        if len(table) == 0:
            raise PromptDataError(f"{path}: dataset has no rows")
        self.path = path
        self.format = _pick_format(list(table.column_names), fmt, path)
        self.messages: list[list[dict[str, str]]] = []
        self.answers: list[Any] = []
        self.token_ids: list[list[int]] = []
        for number, row in enumerate(table, start=1):
            where = f"{path}: row {number}"
            messages = _messages(row, self.format, where)
            if row["answer"] is None:
                raise PromptDataError(f"{where}, column 'answer': missing value")
            ids = _render(messages, self.format, tokenizer, chat_template)
            if not ids:
                raise PromptDataError(f"{where}: the prompt renders to no tokens")
            self.messages.append(messages)
            self.answers.append(row["answer"])
            self.token_ids.append(list(ids))

    @classmethod
    def from_config(cls, data_cfg, tokenizer) -> PromptDataset:
        return cls(
            data_cfg.path, tokenizer, data_cfg.format, data_cfg.split, data_cfg.apply_chat_template
        )

    def __len__(self) -> int:
        return len(self.token_ids)

    def get(self, index: int, epoch: int = 0) -> Prompt:
        return Prompt(
            index, epoch, self.token_ids[index], self.messages[index], self.answers[index]
        )


@functools.lru_cache(maxsize=2)
def _permutation(size: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).permutation(size)


def position(cursor: int, size: int, seed: int) -> tuple[int, int]:
    """Cursor value -> (epoch, row): row = permutation(seed + epoch)[cursor % size]."""
    epoch, offset = divmod(cursor, size)
    return epoch, int(_permutation(size, seed + epoch)[offset])


class PromptSource:
    """Takes the next prompt for this actor from the shared Redis cursor (async redis client)."""

    def __init__(self, dataset: PromptDataset, redis_client, cursor_key: str, seed: int) -> None:
        self.dataset = dataset
        self.redis = redis_client
        self.key = cursor_key
        self.seed = seed

    async def next(self) -> Prompt:
        cursor = int(await self.redis.incr(self.key)) - 1
        epoch, row = position(cursor, len(self.dataset), self.seed)
        return self.dataset.get(row, epoch)
