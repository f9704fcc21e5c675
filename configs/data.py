"""The prompt dataset the actors draw from (``data``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from streamrl.configs.section import Section


class DataConfig(Section):
    """The prompt dataset the actors draw from and its columns."""

    path: str = Field(
        "",
        description="Required. Prompt dataset: JSONL/JSON/Parquet/CSV/Arrow file, a saved or local HF dataset folder, or a hub dataset `org/name` (fetched into the hub cache; HF_HUB_OFFLINE=1 keeps to the cache).",
    )
    config: str | None = Field(
        None, description="Dataset config (subset) name of a hub or local dataset repository."
    )
    format: Literal["auto", "messages", "prompt"] = Field(
        "auto",
        description="messages = a list of {role, content} turns; prompt = a string; auto picks by column name (or by the value of `prompt_key`).",
    )
    prompt_key: str | None = Field(
        None,
        description="Column holding the prompt (string or messages); None = `messages` if present, else `prompt`.",
    )
    answer_key: str | None = Field(
        "answer",
        description="Column passed to the rewards as `answer` (None = no answer column). Every other column reaches the rewards as a keyword argument.",
    )
    split: str = Field("train", description="Split to read from a dataset folder or repository.")
    apply_chat_template: bool | None = Field(
        None,
        description="Render prompts through the tokenizer's chat template: true = always (a string prompt becomes one user turn), false = never (turns' texts joined by newlines), None = for messages rows only.",
    )
    eval_path: str | None = Field(
        None,
        description="Held-out prompt dataset (same forms and columns as `path`); None = no evaluation.",
    )
    eval_split: str | None = Field(None, description="Split of `eval_path` (None = `split`).")
    eval_every: int = Field(
        0,
        ge=0,
        description="Evaluate every this many policy versions on one actor (0 = off): mean reward and pass@1 sampled at rollout.temperature and greedy, to <run.dir>/eval.jsonl and TensorBoard.",
    )
    eval_size: int = Field(
        64, ge=1, description="Most eval prompts per evaluation (the first ones)."
    )
