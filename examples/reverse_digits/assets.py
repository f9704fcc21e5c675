"""The demo's inputs: the policy folder and the prompt file, and those of the SFT and DPO presets.

``streamrl example`` (``streamrl.examples.assets_cli``) calls them as ``fn(path, seed=seed)``.
Each writes once and atomically (under a temporary name in the same folder, renamed into place),
so two makers may race and a reader never sees half a folder or file.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from streamrl.configs.runfiles import write_new
from streamrl.examples.reverse_digits.task import (
    build_model,
    build_tokenizer,
    distinct_examples,
    make_example,
    warm_start_rows,
)

# The warm start of grpo_toy, the synchronous one-file loop the demo is measured against: 60 steps
# at 3e-4 on batches of 256. It leaves the format (three digits, then stop) partly learned; the
# stronger one the demo had (100 at 1e-3 on 64) taught the policy to ignore the prompt, whose
# digits the random targets never depend on, and RL first had to unlearn that
# (docs/bench/longtail.md).
WARM_START_STEPS = 60
WARM_START_LR = 3e-4
WARM_START_BATCH = 256


def build_initial_policy(path: str | os.PathLike, seed: int = 0) -> Path:
    """``configs/sft_cpu.yaml``'s policy: the demo's char tokenizer and its tiny Qwen2, randomly
    initialised from ``seed``, as a Hugging Face folder (written once, atomically)."""
    path = Path(path)
    if (path / "config.json").exists():
        return path
    tokenizer = build_tokenizer()
    model = build_model(len(tokenizer), tokenizer.eos_token_id, tokenizer.pad_token_id, seed=seed)
    with staging(path) as work:
        model.save_pretrained(work / "policy")
        tokenizer.save_pretrained(work / "policy")
        replace_into(work / "policy", path)
    return path


def write_warm_start_dataset(
    path: str | os.PathLike,
    seed: int = 0,
    steps: int = WARM_START_STEPS,
    batch: int = WARM_START_BATCH,
    make=make_example,
) -> Path:
    """``configs/sft_cpu.yaml``'s dataset: the format warm start's
    ``steps`` x ``batch`` prompt/completion rows (``task.warm_start_rows``) as JSONL, once."""
    return write_rows(path, warm_start_rows(steps, batch, seed, make))


def write_preference_dataset(path: str | os.PathLike, seed: int = 0, size: int = 1000) -> Path:
    """``configs/dpo_cpu.yaml``'s dataset: ``size`` distinct prompts, each
    with its reversed digits as ``chosen`` and a wrong answer of as many digits, drawn from
    ``seed``, as ``rejected``.

    Not the digits as they stand: a permutation of the chosen digits scores as the chosen does, on
    average over prompts, under a policy that does not yet read digit positions (the warmed one),
    and DPO sat at log 2 until it grew that attention (issue 49); a wrong answer mostly holds
    digits the prompt lacks, which the policy learns to tell apart within a few dozen steps."""
    rng = random.Random(seed)
    rows = [
        {"prompt": ex["prompt"], "chosen": ex["answer"], "rejected": _wrong(ex["answer"], rng)}
        for ex in distinct_examples(size, seed)
    ]
    return write_rows(path, rows)


def _wrong(answer: str, rng: random.Random) -> str:
    while True:
        drawn = "".join(rng.choice("0123456789") for _ in answer)
        if drawn != answer:
            return drawn


def build_policy(
    path: str | os.PathLike,
    seed: int = 0,
    warm_start_steps: int = WARM_START_STEPS,
    warm_start_lr: float = WARM_START_LR,
    make=make_example,
    warm_start_batch: int = WARM_START_BATCH,
    keep_optimizer: bool = True,
) -> Path:
    """The demo's policy: build (once) the warmed demo policy as a Hugging Face folder
    (``make``: the task whose answer format the warm start teaches).

    The warm start is a ``streamrl sft`` run (``configs/sft_cpu.yaml``, in a process of its own:
    the learner's process group never enters the caller's) from the random init on the
    generated rows, one epoch in their order, ``warm_start_batch`` rows a step.
    ``keep_optimizer``: its AdamW state goes next to the weights (``learner.init_optimizer``),
    so RL continues it rather than starting a fresh one.
    """
    path = Path(path)
    if (path / "config.json").exists():
        return path
    with staging(path) as work:
        initial = build_initial_policy(work / "initial", seed)
        if not warm_start_steps:
            replace_into(initial, path)
            return path
        data = write_warm_start_dataset(
            work / "warm_start.jsonl", seed, warm_start_steps, warm_start_batch, make
        )
        run_sft(
            [
                f"model.path={initial}",
                f"supervised.path={data}",
                f"supervised.batch_size={warm_start_batch}",
                f"supervised.save_optimizer={str(keep_optimizer).lower()}",
                f"learner.lr={warm_start_lr}",
                f"run.dir={work / 'run'}",
                f"run.seed={seed}",
                # a throw-away run folder: no event files
                "run.report_to=[]",
            ]
        )
        replace_into(work / "run" / "policy", path)
    return path


def run_sft(overrides: list[str]) -> None:
    """``streamrl sft --config sft_cpu`` with ``overrides``, in a child process (its output is
    shown only when it fails)."""
    done = subprocess.run(
        [sys.executable, "-m", "streamrl", "sft", "--config", "sft_cpu", *overrides],
        capture_output=True,
        text=True,
        # the child's one torch thread, as the caller's; not the learner's pinning of a run
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    if done.returncode:
        raise RuntimeError(f"streamrl sft failed ({done.returncode}):\n{done.stdout}{done.stderr}")


@contextlib.contextmanager
def staging(path: Path) -> Iterator[Path]:
    """A fresh folder beside ``path`` (same file system, so a rename moves it into place) where
    it is built, removed afterwards with whatever was left in it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        yield work
    finally:
        shutil.rmtree(work, ignore_errors=True)


def replace_into(src: Path, dst: Path) -> None:
    """Move the folder ``src`` to ``dst`` (atomic: a reader never sees half a folder) unless a
    concurrent maker got there first."""
    try:
        os.replace(src, dst)
    except OSError:
        if not (dst / "config.json").exists():
            raise


def write_rows(path: str | os.PathLike, rows: list[dict]) -> Path:
    """Write ``rows`` as JSONL at ``path`` once, atomically (``configs.runfiles.write_new``: an
    exclusive temporary name, renamed into place)."""
    path = Path(path)
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    write_new(path, "".join(json.dumps(row) + "\n" for row in rows))
    return path


def write_dataset(path: str | os.PathLike, size: int = 1000, seed: int = 0) -> Path:
    """The demo's prompts: write them as JSONL (``prompt`` + ``answer``) once.

    Every prompt is distinct (the default 1,000 rows are all 3-digit numbers,
    shuffled by ``seed``): rows drawn with replacement held only ~630 distinct prompts.
    """
    if Path(path).exists():
        return Path(path)
    return write_rows(path, distinct_examples(size, seed))
