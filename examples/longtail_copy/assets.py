"""The long-tail task's inputs (``streamrl example longtail``): the warmed policy folder and the prompts."""

from __future__ import annotations

import os
from pathlib import Path

from streamrl.examples.longtail_copy.task import examples, warm_start_example
from streamrl.examples.reverse_digits import assets

# A light warm start: the format (as many digits as the prompt, then EOS) partly learned.
# The demo's stronger one (1e-3) teaches the policy to ignore the prompt, whose digits the
# warm start's random targets never depend on, and RL then sits at the digits' chance level.
WARM_START_STEPS = 100
WARM_START_LR = 3e-4
WARM_START_BATCH = 64


def build_policy(
    path: str | os.PathLike,
    seed: int = 0,
    warm_start_steps: int = WARM_START_STEPS,
    warm_start_lr: float = WARM_START_LR,
) -> Path:
    """The task's policy: the demo's tiny Qwen2, warmed on random digits of every length + EOS.

    Like the demo's warm start it teaches the format (as many digits as the prompt, then
    stop), not the answer: RL has to learn to copy.
    """
    return assets.build_policy(
        path,
        seed,
        warm_start_steps,
        warm_start_lr,
        make=warm_start_example,
        warm_start_batch=WARM_START_BATCH,
    )


def write_dataset(path: str | os.PathLike, size: int = 2000, seed: int = 0) -> Path:
    """The task's prompts: ``size`` heavy-tailed prompts as JSONL (``prompt`` + ``answer``)."""
    if Path(path).exists():
        return Path(path)
    return assets.write_rows(path, examples(size, seed))
