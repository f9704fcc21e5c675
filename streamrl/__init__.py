"""streamrl: asynchronous off-policy actor-learner RL for language models.

actors -> Redis stream -> DeepSpeed ZeRO-2 learner -> versioned weights -> actors.

The subsystems are the subpackages ``streamrl.actors``, ``streamrl.broker``,
``streamrl.learner``, ``streamrl.weightsync``, ``streamrl.configs`` and
``streamrl.launch``; in the repository they are the top-level folders of the same
names (``pyproject.toml`` maps them into this package). ``streamrl.examples`` (the
folder ``examples/``) holds the example tasks, the CPU demo among them; the core never
imports it.
"""

from __future__ import annotations

from pathlib import Path

__version__ = "0.1.0"

# A source checkout that is not installed (a clone on PYTHONPATH, a git worktree) keeps the
# subpackages beside this folder, not inside it: look there too. An installed wheel has them
# inside, and an editable install's finder maps each one, so neither takes this branch.
_here = Path(__file__).resolve().parent
if not (_here / "learner").is_dir() and (_here.parent / "pyproject.toml").is_file():
    __path__.append(str(_here.parent))
