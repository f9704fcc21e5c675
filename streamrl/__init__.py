"""streamrl: asynchronous off-policy actor-learner RL for language models.

actors -> Redis stream -> DeepSpeed ZeRO-2 learner -> versioned weights -> actors.

The subsystems are the subpackages ``streamrl.actors``, ``streamrl.broker``,
``streamrl.learner``, ``streamrl.weightsync``, ``streamrl.policy``, ``streamrl.runtime`` (what
every process does around its own job), ``streamrl.configs`` and ``streamrl.launch``; in the
repository they are the top-level folders of the same
names (``pyproject.toml`` maps them into this package). ``streamrl.examples`` (the
folder ``examples/``) holds the example tasks, the CPU demo among them; the core never
imports it.

The Python API::

    import streamrl

    cfg = streamrl.load_config("demo_cpu", {"run.max_steps": 50})
    result = streamrl.run(cfg, actors=2)
    print(result.steps, result.final_reward, result.reason, result.run_dir)

or TRL's shape, ``streamrl.GRPOTrainer(model=..., reward_funcs=..., train_dataset=...,
args=cfg, callbacks=[...]).train()`` (``streamrl.launch.trainers``).
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING

__version__ = "0.1.0"

# A source checkout that is not installed (a clone on PYTHONPATH, a git worktree) keeps the
# subpackages beside this folder, not inside it: look there too. An installed wheel has them
# inside, and an editable install's finder maps each one, so neither takes this branch.
_here = Path(__file__).resolve().parent
if not (_here / "learner").is_dir() and (_here.parent / "pyproject.toml").is_file():
    __path__.append(str(_here.parent))

# The API is imported on first use: every streamrl process imports this package first, and
# a learner or an actor needs neither the launcher nor its dependencies.
_API = {
    "Config": "streamrl.configs.schema",
    "DPOTrainer": "streamrl.launch.trainers",
    "GRPOTrainer": "streamrl.launch.trainers",
    "SFTTrainer": "streamrl.launch.trainers",
    "StreamRLError": "streamrl.configs.errors",
    "load_config": "streamrl.configs.load",
    "presets": "streamrl.configs.load",
    "RunSummary": "streamrl.launch.run",
    "run": "streamrl.launch.run",
}
__all__ = [
    "Config",
    "DPOTrainer",
    "GRPOTrainer",
    "RunSummary",
    "SFTTrainer",
    "StreamRLError",
    "__version__",
    "load_config",
    "presets",
    "run",
]

if TYPE_CHECKING:
    from streamrl.configs.errors import StreamRLError
    from streamrl.configs.load import load_config, presets
    from streamrl.configs.schema import Config
    from streamrl.launch.run import RunSummary, run
    from streamrl.launch.trainers import DPOTrainer, GRPOTrainer, SFTTrainer


def __getattr__(name: str):
    if name not in _API:
        raise AttributeError(f"module 'streamrl' has no attribute {name!r}")
    return getattr(importlib.import_module(_API[name]), name)


def __dir__() -> list[str]:
    return sorted({*globals(), *_API})
