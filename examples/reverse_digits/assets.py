"""The demo's inputs: the policy folder (``model.build``) and the prompt file (``data.build``).

streamrl calls a hook as ``fn(path, seed=run.seed)`` when the path is missing; both
write atomically, so the launcher and a lone actor may race to build them.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from streamrl.examples.reverse_digits.task import (
    WARM_START_BETAS,
    build_model,
    build_tokenizer,
    distinct_examples,
    format_warm_start,
    make_example,
)

# The warm start of grpo_toy, the synchronous one-file loop the demo is measured against: 60 steps
# at 3e-4 on batches of 256. It leaves the format (three digits, then stop) partly learned; the
# stronger one the demo had (100 at 1e-3 on 64) taught the policy to ignore the prompt, whose
# digits the random targets never depend on, and RL first had to unlearn that
# (docs/bench/longtail.md).
WARM_START_STEPS = 60
WARM_START_LR = 3e-4
WARM_START_BATCH = 256


def build_policy(
    path: str | os.PathLike,
    seed: int = 0,
    warm_start_steps: int = WARM_START_STEPS,
    warm_start_lr: float = WARM_START_LR,
    make=make_example,
    warm_start_batch: int = WARM_START_BATCH,
    keep_optimizer: bool = True,
) -> Path:
    """The ``model.build`` hook: build (once) the warmed demo policy as a Hugging Face folder
    (``make``: the task whose answer format the warm start teaches).

    ``keep_optimizer``: the warm start's AdamW state goes next to the weights
    (``learner.init_optimizer``), so RL continues it rather than starting a fresh one.
    """
    import torch

    from streamrl.learner import init_optimizer

    path = Path(path)
    if (path / "config.json").exists():
        return path
    tokenizer = build_tokenizer()
    model = build_model(len(tokenizer), tokenizer.eos_token_id, tokenizer.pad_token_id, seed=seed)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=warm_start_lr, betas=WARM_START_BETAS, weight_decay=0.0
    )
    if warm_start_steps:
        format_warm_start(
            model,
            tokenizer,
            steps=warm_start_steps,
            batch=warm_start_batch,
            lr=warm_start_lr,
            seed=seed,
            optimizer=optimizer,
            make=make,
        )
    tmp = path.with_name(path.name + ".tmp")
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    if warm_start_steps and keep_optimizer:
        init_optimizer.save(tmp, model, optimizer)
    # atomic: concurrent builders never see half a folder
    os.replace(tmp, path)
    return path


def write_rows(path: str | os.PathLike, rows: list[dict]) -> Path:
    """Write ``rows`` as JSONL at ``path`` once, atomically."""
    path = Path(path)
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    os.replace(tmp, path)
    return path


def write_dataset(path: str | os.PathLike, size: int = 1000, seed: int = 0) -> Path:
    """The ``data.build`` hook: write the demo prompts as JSONL (``prompt`` + ``answer``) once.

    Every prompt is distinct (the default 1,000 rows are all 3-digit numbers,
    shuffled by ``seed``): rows drawn with replacement held only ~630 distinct prompts.
    """
    if Path(path).exists():
        return Path(path)
    return write_rows(path, distinct_examples(size, seed))
