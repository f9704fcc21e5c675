"""A supervised dataset as the learner's ``Sample``s: which tokens a row holds, which are trained.

SFT rows are a chat (``messages``: the loss on the assistant turns only), a ``prompt`` and a
``completion`` (the loss on the completion and an end-of-sequence token), or TRL's plain ``text``
(the loss on every token and an end-of-sequence token). DPO rows are
``chosen``/``rejected`` responses, either strings after a ``prompt`` (a string or messages) or
whole chats sharing their beginning, the response being the last assistant turn.

A chat's assistant tokens are found as RL2 does: the tokens the chat template renders for the
turns before an assistant turn plus its generation prompt are a prefix of those it renders with
that turn, and the tokens in between are the turn (its end-of-turn marker included). A template
for which that does not hold is refused, naming the row. A ``Sample`` trains the tokens of its
``loss_mask`` after ``prompt_len`` (the first trained token), so the packing, collation and
log-probs of the RL learner serve unchanged.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np

from streamrl.learner.batching import Sample


class SupervisedDataError(ValueError):
    """A dataset row that cannot train, named by its file and line: a user's mistake, said in one
    line by the command (``launch.supervised``), never a traceback."""


def read_rows(path: str | os.PathLike) -> list[tuple[int, dict]]:
    """The JSONL rows of ``path`` with their line numbers; SupervisedDataError names a line that
    is not a JSON object (and the column where its JSON breaks)."""
    name, rows = Path(path).name, []
    with open(path, encoding="utf-8", errors="replace") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line.rstrip("\r\n"))
            except json.JSONDecodeError as exc:
                raise SupervisedDataError(
                    f"{name}:{number}: not JSON ({exc.msg} at column {exc.colno})"
                ) from None
            if not isinstance(row, dict):
                raise SupervisedDataError(f"{name}:{number}: not a JSON object")
            rows.append((number, row))
    if not rows:
        raise SupervisedDataError(f"{name}: no rows")
    return rows


def _chat_ids(tokenizer, messages: list[dict], generation_prompt: bool) -> list[int]:
    return list(
        tokenizer.apply_chat_template(
            messages, tokenize=True, add_generation_prompt=generation_prompt, return_dict=False
        )
    )


def chat_tokens(
    tokenizer, messages: list[dict], last_only: bool = False
) -> tuple[list[int], list[bool]]:
    """A chat's token ids and which of them are assistant tokens (``last_only``: the last turn's)."""
    ids: list[int] = []
    mask: list[bool] = []
    for i, message in enumerate(messages):
        if message.get("role") != "assistant":
            continue
        before = _chat_ids(tokenizer, messages[:i], generation_prompt=True) if i else []
        upto = _chat_ids(tokenizer, messages[: i + 1], generation_prompt=False)
        if upto[: len(before)] != before or before[: len(ids)] != ids:
            raise ValueError(
                "the chat template does not render a chat as the prefix of its continuation: "
                "cannot tell the assistant tokens apart"
            )
        trained = not last_only or i == len(messages) - 1
        mask += [False] * (len(before) - len(ids)) + [trained] * (len(upto) - len(before))
        ids = upto
    full = _chat_ids(tokenizer, messages, generation_prompt=False)
    if full[: len(ids)] != ids:
        raise ValueError("the chat template renders the whole chat differently from its turns")
    mask += [False] * (len(full) - len(ids))
    return full, mask


def _text_ids(tokenizer, prompt) -> list[int]:
    if isinstance(prompt, list):
        return _chat_ids(tokenizer, prompt, generation_prompt=True)
    return list(tokenizer(prompt, add_special_tokens=False)["input_ids"])


def completion_tokens(tokenizer, prompt, completion: str) -> tuple[list[int], list[bool]]:
    """``prompt`` (text, or messages rendered with the generation prompt) then ``completion`` and
    the end-of-sequence token; the mask covers the completion and the end token."""
    head = _text_ids(tokenizer, prompt)
    tail = list(tokenizer(completion, add_special_tokens=False)["input_ids"])
    if tokenizer.eos_token_id is not None and (not tail or tail[-1] != tokenizer.eos_token_id):
        tail.append(tokenizer.eos_token_id)
    return head + tail, [False] * len(head) + [True] * len(tail)


def to_sample(ids: list[int], mask: list[bool], max_length: int, name: str) -> Sample:
    """The ``Sample`` training the ``mask`` tokens of ``ids`` (cut to ``max_length``). The first
    token is never trained: nothing before it predicts it."""
    ids, mask = ids[:max_length], mask[:max_length]
    trained = [i for i, m in enumerate(mask) if m and i > 0]
    if not trained:
        raise ValueError(f"{name}: no trained token within supervised.max_length={max_length}")
    start = trained[0]
    n = len(ids) - start
    return Sample(
        input_ids=np.asarray(ids, dtype=np.int64),
        prompt_len=start,
        behaviour_logprobs=np.zeros(n, dtype=np.float32),
        versions=np.zeros(n, dtype=np.int64),
        advantage=0.0,
        reward=0.0,
        group_id=name,
        loss_mask=np.asarray(mask[start:], dtype=bool),
    )


def text_tokens(tokenizer, text: str) -> tuple[list[int], list[bool]]:
    """Plain text (TRL's language-modelling rows) and the end-of-sequence token, every token trained."""
    return completion_tokens(tokenizer, "", text)


def sft_sample(tokenizer, row: dict, max_length: int, name: str) -> Sample:
    if "messages" in row:
        ids, mask = chat_tokens(tokenizer, row["messages"])
    elif "prompt" in row and "completion" in row:
        ids, mask = completion_tokens(tokenizer, row["prompt"], row["completion"])
    elif isinstance(row.get("text"), str):
        ids, mask = text_tokens(tokenizer, row["text"])
    else:
        raise ValueError(f"{name}: an SFT row holds `messages`, `prompt` + `completion`, or `text`")
    return to_sample(ids, mask, max_length, name)


def _response_tokens(tokenizer, row: dict, key: str) -> tuple[list[int], list[bool]]:
    response = row[key]
    if isinstance(response, list):
        prompt = row.get("prompt", [])
        if not isinstance(prompt, list):
            raise ValueError(f"`{key}` is messages: its `prompt` must be messages too")
        chat = [*prompt, *response]
        if not chat or chat[-1].get("role") != "assistant":
            raise ValueError(f"`{key}` must end with an assistant turn")
        return chat_tokens(tokenizer, chat, last_only=True)
    if "prompt" not in row:
        raise ValueError(f"a string `{key}` needs a `prompt`")
    return completion_tokens(tokenizer, row["prompt"], response)


def pair_samples(tokenizer, row: dict, max_length: int, name: str) -> tuple[Sample, Sample]:
    """(chosen, rejected) of a preference row."""
    if "chosen" not in row or "rejected" not in row:
        raise ValueError(f"{name}: a preference row holds `chosen` and `rejected`")
    try:
        return tuple(
            to_sample(*_response_tokens(tokenizer, row, key), max_length, f"{name}/{key}")
            for key in ("chosen", "rejected")
        )
    except ValueError as exc:
        raise ValueError(f"{name}: {exc}") from None


def load_sft(path: str | os.PathLike, tokenizer, max_length: int) -> list[Sample]:
    return _load(path, lambda row, name: sft_sample(tokenizer, row, max_length, name))


def load_pairs(path: str | os.PathLike, tokenizer, max_length: int) -> list[tuple[Sample, Sample]]:
    return _load(path, lambda row, name: pair_samples(tokenizer, row, max_length, name))


def _load(path: str | os.PathLike, example: Callable[[dict, str], object]) -> list:
    """``example(row, "file:line")`` of every row; a row it refuses is a SupervisedDataError."""
    out = []
    for number, row in read_rows(path):
        name = f"{Path(path).name}:{number}"
        try:
            out.append(example(row, name))
        except SupervisedDataError:
            raise
        # the row's own error, which names it (a chat template it does not fit, no trained token)
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            said = str(exc)
            raise SupervisedDataError(
                said if said.startswith(name) else f"{name}: {said}"
            ) from None
    return out
