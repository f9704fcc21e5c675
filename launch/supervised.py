"""``streamrl sft`` and ``streamrl dpo``: check the inputs, then train on the learner.

The policy at ``model.path`` and the dataset at ``supervised.path`` must be there (nothing fills
in a missing one: ``streamrl example sft`` / ``dpo`` make the presets'); then the objective
(``learner.sft``, ``learner.dpo``) trains in this process (``learner.supervised.train``).
Several ranks: ``torchrun --nproc_per_node N -m streamrl.launch.sft --config ...``.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from streamrl.actors import inputs
from streamrl.configs import config_from_cli
from streamrl.configs.errors import ConfigError
from streamrl.configs.runfiles import check_run_dir, enter_run_dir
from streamrl.configs.schema import Config, ModelConfig, SupervisedConfig
from streamrl.learner import tracking

# what a supervised run writes below run.dir (configs.runfiles)
RUN_DIRS = ("checkpoints",)

if TYPE_CHECKING:
    from streamrl.learner.progress import Progress
    from streamrl.learner.supervised import Supervised


def check_inputs(model: ModelConfig, supervised: SupervisedConfig) -> None:
    """ConfigError in one line naming the key when the policy or the dataset is not there."""
    if not supervised.path:
        raise ConfigError("supervised.path is not set: name the dataset file (JSONL)")
    inputs.check_example_path("model.path", model.path, (supervised.path,))
    try:
        inputs.check(model, None)
    except FileNotFoundError as exc:
        raise ConfigError(str(exc)) from None
    inputs.check_example_path("supervised.path", supervised.path, (model.path,))
    if not os.path.exists(supervised.path):
        raise ConfigError(f"supervised.path={supervised.path}: no such file")


def prepare(cfg: Config, kind: type[Supervised]) -> list:
    """Everything before training, each refusal a ConfigError in one line before anything past it
    is built or made: the run directory, a missing tracker, a missing input,
    a row that cannot train; then ``run.dir`` is entered. Returns the dataset's examples."""
    check_run_dir(cfg.run.dir, dirs=RUN_DIRS)
    tracking.check_installed(cfg.run)
    import torch

    torch.set_num_threads(cfg.run.torch_threads)
    check_inputs(cfg.model, cfg.supervised)
    from streamrl.learner.supervised_data import SupervisedDataError

    try:
        examples = kind.examples_of(cfg.supervised, cfg.model.path)
    except SupervisedDataError as exc:
        raise ConfigError(f"supervised.path={cfg.supervised.path}: {exc}") from None
    # the run-directory policy (configs.runfiles): its checkpoints and exported policy are its
    # user's only, in a directory only its user can change
    enter_run_dir(cfg.run.dir, cfg.run.shared_read, dirs=RUN_DIRS)
    return examples


def run_supervised(
    cfg: Config, kind: type[Supervised], on_row: Callable[[dict], None] | None = None
) -> Progress:
    """``prepare``, then train ``kind`` in this process to its end under the run's bar;
    ``on_row(row)`` with each step row."""
    examples = prepare(cfg, kind)
    from streamrl.launch.view import StepBar
    from streamrl.learner.supervised import train

    bar = StepBar(cfg.run.max_time_s)
    try:
        return train(cfg, kind, lambda line: print(line, flush=True), bar.step, examples, on_row)
    finally:
        bar.close()


def main(
    name: str, objective: Callable[[], type[Supervised]], argv: list[str] | None = None
) -> int:
    """``streamrl <name>``: check the inputs, enter ``run.dir``, then train
    ``objective()`` (imported only then: a refusal costs no torch import)."""
    parser = argparse.ArgumentParser(
        prog=f"streamrl {name}",
        description=f"{name.upper()} on the streamrl learner from supervised.path (no actors, no Redis)",
    )
    parser.add_argument("--local_rank", type=int, default=None, help=argparse.SUPPRESS)
    _args, cfg = config_from_cli(parser, argv)
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s {name} %(levelname)s %(message)s")
    try:
        run_supervised(cfg, objective())
    except ConfigError as exc:
        print(f"streamrl {name}: {exc}", file=sys.stderr)
        return 2
    # the command's process ends here; in a Python process (SFTTrainer, then DPOTrainer...) the
    # group stays for the next run, whose DeepSpeed engine would find a destroyed one
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
    return 0
