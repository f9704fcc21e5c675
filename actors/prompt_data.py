"""Prompt datasets and the prompt order all actors share.

Loading, through the ``datasets`` library (a local JSONL file is parsed with ``json``, which
is cheaper to start): JSON, Parquet, CSV and Arrow files,
saved dataset folders (``save_to_disk``), local dataset repositories, and hub datasets
(``data.path`` = ``org/name``, with ``data.config`` and ``data.split``; the repository is
fetched into the hub cache with ``snapshot_download`` and read with ``load_dataset``, so
``HF_HUB_OFFLINE=1`` works from a cache). The prompt column (``data.prompt_key``; by
default ``messages`` if present, else ``prompt``) holds either RL2-style ``messages`` (a
list of ``{role, content}``) or a string; ``data.answer_key`` names the answer column.
Every other column of a row rides along to the reward functions as keyword arguments.
Every row is validated and tokenized at load time, so malformed data fails before
anything starts, with the file, row and column named.

Order: one Redis counter (``prompts:cursor``) is INCRed per prompt taken. Value
``c`` maps to epoch ``c // size`` and to row ``permutation(seed + epoch)[c % size]``:
actors can join or leave at any time, and no two actors get the same prompt
within an epoch.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from streamrl.configs.errors import StreamRLError

_FILE_BUILDERS = {
    ".jsonl": "json",
    ".json": "json",
    ".parquet": "parquet",
    ".csv": "csv",
    ".arrow": "arrow",
}


class PromptDataError(StreamRLError, ValueError):
    """A dataset that cannot be used; the message names the file, row and column."""


@dataclass
class Prompt:
    # row in the dataset
    index: int
    epoch: int
    token_ids: list[int]
    # the conversation before the completion
    messages: list[dict[str, str]]
    answer: Any
    # the row's other columns, for rewards
    columns: dict[str, Any] = field(default_factory=dict)
    # a messages row (batched rewards get a string prompt's completions as strings, as TRL does)
    conversational: bool = True

    @property
    def prompt_id(self) -> str:
        return f"row{self.index}"


# columns that would collide with the reward functions' positional parameters
_RESERVED = ("messages", "answer")
_SAVED_MARKERS = ("dataset_dict.json", "dataset_info.json", "state.json")


def _looks_local(path: Path) -> bool:
    text = str(path)
    return (
        path.is_absolute()
        or text.startswith((".", "~"))
        or path.suffix.lower() in _FILE_BUILDERS
        or text.count("/") != 1
    )


def check_dataset_path(path: str | os.PathLike) -> None:
    """PromptDataError naming ``data.path`` when it is a local path with nothing there (a hub
    dataset id resolves only when loaded)."""
    path = Path(path)
    if not path.exists() and _looks_local(path):
        raise PromptDataError(f"data.path: {path}: dataset does not exist")


def _load_table(path: Path, split: str, config: str | None = None):
    if path.suffix.lower() == ".jsonl" and path.is_file():
        return _Rows(_check_json_lines(path))
    import datasets

    datasets.disable_progress_bars()
    if not path.exists():
        if _looks_local(path):
            raise PromptDataError(f"{path}: dataset does not exist")
        return _load_repo(_hub_snapshot(str(path)), config, split, str(path))
    if path.is_dir():
        if not any((path / marker).exists() for marker in _SAVED_MARKERS):
            return _load_repo(str(path), config, split, str(path))
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
    # datasets wraps parser errors in several types
    except Exception as exc:
        cause = exc.__cause__ or exc
        raise PromptDataError(
            f"{path}: cannot read as {builder}: {type(cause).__name__}: {cause}"
        ) from None


def _hub_snapshot(name: str) -> str:
    """The hub-cache folder of dataset repository ``name`` (downloaded unless HF_HUB_OFFLINE is set)."""
    from huggingface_hub import snapshot_download

    try:
        return snapshot_download(name, repo_type="dataset")
    # invalid id, offline cache miss, unknown or gated repo, no network
    except Exception as exc:
        raise PromptDataError(
            f"{name}: not a local file or folder, and no hub dataset of that name could be "
            f"resolved ({type(exc).__name__}: {exc})"
        ) from None


def _load_repo(folder: str, config: str | None, split: str, shown: str):
    """A dataset repository (hub snapshot or local clone) read by ``load_dataset``."""
    import datasets

    try:
        return datasets.load_dataset(folder, config, split=split)
    # unknown config or split, unreadable data files
    except Exception as exc:
        raise PromptDataError(
            f"{shown} (config {config!r}, split {split!r}): cannot load: {type(exc).__name__}: {exc}"
        ) from None


def _check_json_lines(path: Path) -> list[dict] | None:
    """Name the first bad line of a JSONL file (datasets' own error does not); its rows, or None
    for a ``.json`` file (``load_dataset`` reads those: a list, or a dict of columns, or more)."""
    if path.suffix.lower() != ".jsonl":
        try:
            json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise PromptDataError(f"{path}: not valid JSON: {exc}") from None
        return None
    rows = []
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
            rows.append(row)
    return rows


class _Rows:
    """A JSONL file's rows as the table ``PromptDataset`` reads, parsed once by
    ``_check_json_lines``. ``datasets`` is not imported for it: with pandas and pyarrow that is
    ~0.6 CPU-s in every actor at start-up (docs/startup.md). As ``load_dataset("json")`` gives
    them: the columns in first-seen order, None where a row lacks one."""

    def __init__(self, rows: list[dict]) -> None:
        self.column_names = list(dict.fromkeys(key for row in rows for key in row))
        self._rows = rows

    def __len__(self) -> int:
        return len(self._rows)

    def __getitem__(self, index: int) -> dict:
        row = self._rows[index]
        return {column: row.get(column) for column in self.column_names}

    def __iter__(self):
        return (self[i] for i in range(len(self)))


def _pick_columns(
    table, wanted: str, prompt_key: str | None, answer_key: str | None, path: Path
) -> tuple[str, str]:
    """(format, prompt column) of the table; PromptDataError naming what is missing."""
    columns = list(table.column_names)
    if prompt_key is None:
        if wanted == "auto":
            wanted = "messages" if "messages" in columns else "prompt"
        prompt_key = wanted
    elif wanted == "auto" and prompt_key in columns:
        wanted = "messages" if isinstance(table[0][prompt_key], list) else "prompt"
    needed = [prompt_key] + ([answer_key] if answer_key else [])
    missing = [c for c in needed if c not in columns]
    if missing:
        raise PromptDataError(
            f"{path}: format {wanted!r} needs columns {needed}; missing {missing} (has {columns})"
        )
    return wanted, prompt_key


def _messages(row: dict, fmt: str, key: str, where: str) -> list[dict[str, str]]:
    if fmt == "prompt":
        prompt = row[key]
        if not isinstance(prompt, str) or not prompt:
            raise PromptDataError(
                f"{where}, column {key!r}: expected a non-empty string, got {prompt!r:.80}"
            )
        return [{"role": "user", "content": prompt}]
    messages = row[key]
    if not isinstance(messages, list) or not messages:
        raise PromptDataError(
            f"{where}, column {key!r}: expected a non-empty list, got {messages!r:.80}"
        )
    for turn in messages:
        if (
            not isinstance(turn, dict)
            or not isinstance(turn.get("role"), str)
            or not isinstance(turn.get("content"), str)
        ):
            raise PromptDataError(
                f"{where}, column {key!r}: expected {{role, content}} strings, got {turn!r:.80}"
            )
    return [{"role": t["role"], "content": t["content"]} for t in messages]


def _render(
    messages: list[dict[str, str]],
    fmt: str,
    tokenizer,
    chat_template: bool | None,
    template_kwargs: Mapping[str, Any],
) -> list[int]:
    """Prompt token ids; ``chat_template`` None = the template for messages rows only."""
    if chat_template is None:
        chat_template = fmt == "messages"
    if chat_template:
        if not getattr(tokenizer, "chat_template", None):
            raise PromptDataError("rendering messages needs a tokenizer with a chat template")
        ids = tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, **template_kwargs
        )
        return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)
    # without a template the turns' texts are the prompt, one after the other
    text = "\n".join(turn["content"] for turn in messages)
    return tokenizer(text, add_special_tokens=True)["input_ids"]


class PromptDataset:
    """All rows, validated and tokenized. ``fmt``: auto | messages | prompt (see cfg.data)."""

    def __init__(
        self,
        path: str | os.PathLike,
        tokenizer,
        fmt: str = "auto",
        split: str = "train",
        chat_template: bool | None = None,
        prompt_key: str | None = None,
        answer_key: str | None = "answer",
        config: str | None = None,
        template_kwargs: Mapping[str, Any] | None = None,
    ):
        path = Path(path)
        table = _load_table(path, split, config)
        if len(table) == 0:
            raise PromptDataError(f"{path}: dataset has no rows")
        self.path = path
        self.format, self.prompt_key = _pick_columns(table, fmt, prompt_key, answer_key, path)
        self.messages: list[list[dict[str, str]]] = []
        self.answers: list[Any] = []
        self.columns: list[dict[str, Any]] = []
        self.token_ids: list[list[int]] = []
        for number, row in enumerate(table, start=1):
            where = f"{path}: row {number}"
            messages = _messages(row, self.format, self.prompt_key, where)
            answer = row[answer_key] if answer_key else None
            if answer_key and answer is None:
                raise PromptDataError(f"{where}, column {answer_key!r}: missing value")
            ids = _render(messages, self.format, tokenizer, chat_template, template_kwargs or {})
            if not ids:
                raise PromptDataError(f"{where}: the prompt renders to no tokens")
            self.messages.append(messages)
            self.answers.append(answer)
            self.columns.append({k: v for k, v in row.items() if k not in _RESERVED})
            self.token_ids.append(list(ids))

    @classmethod
    def from_config(
        cls,
        data_cfg,
        tokenizer,
        held_out: bool = False,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> PromptDataset:
        """The dataset at ``data.path``, or with ``held_out`` the evaluation prompts at
        ``data.eval_path`` (read alike, from ``data.eval_split`` or ``data.split``); its errors
        name that key. ``template_kwargs``: ``rollout.chat_template_kwargs``."""
        key, path = (
            ("data.eval_path", data_cfg.eval_path) if held_out else ("data.path", data_cfg.path)
        )
        split = (data_cfg.eval_split if held_out else None) or data_cfg.split
        try:
            return cls(
                path,
                tokenizer,
                data_cfg.format,
                split,
                data_cfg.apply_chat_template,
                data_cfg.prompt_key,
                data_cfg.answer_key,
                data_cfg.config,
                template_kwargs,
            )
        except PromptDataError as exc:
            raise PromptDataError(f"{key}: {exc}") from None

    def __len__(self) -> int:
        return len(self.token_ids)

    def get(self, index: int, epoch: int = 0) -> Prompt:
        return Prompt(
            index,
            epoch,
            self.token_ids[index],
            self.messages[index],
            self.answers[index],
            self.columns[index],
            self.format == "messages",
        )


@functools.lru_cache(maxsize=2)
def _permutation(size: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).permutation(size)


def position(cursor: int, size: int, seed: int) -> tuple[int, int]:
    """Cursor value -> (epoch, row): row = permutation(seed + epoch)[cursor % size]."""
    epoch, offset = divmod(cursor, size)
    return epoch, int(_permutation(size, seed + epoch)[offset])


class PromptCursor:
    """The next prompt for this actor from the run's shared Redis cursor (async redis client)."""

    def __init__(self, dataset: PromptDataset, redis_client, cursor_key: str, seed: int) -> None:
        self.dataset = dataset
        self.redis = redis_client
        self.key = cursor_key
        self.seed = seed

    async def next(self) -> Prompt:
        cursor = int(await self.redis.incr(self.key)) - 1
        epoch, row = position(cursor, len(self.dataset), self.seed)
        return self.dataset.get(row, epoch)
