"""The tasks the system benchmarks run: the CPU demo and the long-tail copy task.

Each names its preset, the functions that make its warmed policy and prompts, the
warm start itself (for a loop that keeps the warm start's optimizer) and the reward
part its target asks for. Both score completions with the demo's position-by-position
reward (``reverse_digits_reward``), which compares with whatever the answer is.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from streamrl.examples import longtail_copy, reverse_digits
from streamrl.examples.longtail_copy.assets import WARM_START_BATCH, WARM_START_LR, WARM_START_STEPS
from streamrl.examples.longtail_copy.rewards import EXACT_PART as COPY_EXACT
from streamrl.examples.longtail_copy.task import warm_start_example
from streamrl.examples.reverse_digits import assets as demo_assets
from streamrl.examples.reverse_digits.rewards import EXACT_PART as REVERSE_EXACT
from streamrl.examples.reverse_digits.task import format_warm_start


@dataclass(frozen=True)
class Task:
    name: str
    config: str
    build_policy: Callable
    write_dataset: Callable
    # (model, tokenizer, seed, optimizer): the warm start build_policy runs, on a caller's optimizer
    warm_start: Callable
    # the exact-match reward part of the preset's run.target_parts
    exact_part: str

    def target(self) -> tuple[float, float, int]:
        """(reward, exact match, window) of the preset's ``run.target_*``."""
        from streamrl.configs import load_config

        run = load_config(self.config, [], env={}).run
        return run.target_reward, run.target_parts.get(self.exact_part, 0.0), run.target_window


def _demo_warm_start(model, tokenizer, seed: int, optimizer) -> float:
    return format_warm_start(
        model,
        tokenizer,
        steps=demo_assets.WARM_START_STEPS,
        batch=demo_assets.WARM_START_BATCH,
        lr=demo_assets.WARM_START_LR,
        seed=seed,
        optimizer=optimizer,
    )


def _longtail_warm_start(model, tokenizer, seed: int, optimizer) -> float:
    return format_warm_start(
        model,
        tokenizer,
        steps=WARM_START_STEPS,
        batch=WARM_START_BATCH,
        lr=WARM_START_LR,
        seed=seed,
        optimizer=optimizer,
        make=warm_start_example,
    )


DEMO = Task(
    "demo",
    "configs/demo_cpu.yaml",
    reverse_digits.build_policy,
    reverse_digits.write_dataset,
    _demo_warm_start,
    REVERSE_EXACT,
)
LONGTAIL = Task(
    "longtail",
    "configs/longtail_cpu.yaml",
    longtail_copy.build_policy,
    longtail_copy.write_dataset,
    _longtail_warm_start,
    COPY_EXACT,
)
TASKS = {task.name: task for task in (DEMO, LONGTAIL)}
