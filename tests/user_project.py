"""A user's own project directory, whose packages are named like streamrl's folders.

Every process streamrl starts puts its working directory first on ``sys.path``; an ML repository
often has packages called ``configs``, ``learner``, ``actors`` or ``launch`` of its own. Here each
raises on import, so any streamrl module still importing a bare top-level name fails the run.
"""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
USER_PACKAGES = (
    "configs",
    "learner",
    "actors",
    "launch",
    "broker",
    "weightsync",
    "policy",
    "runtime",
)
# in a process's output when one of the user's packages was imported
IMPORTED = "user project"


def user_project(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """The project directory, and an environment where only the checkout's ``streamrl`` is
    importable (ROOT on sys.path would let a bare ``import configs`` find the real one)."""
    project = tmp_path / "my_project"
    for name in USER_PACKAGES:
        (project / name).mkdir(parents=True)
        (project / name / "__init__.py").write_text(
            f"raise ImportError('the {IMPORTED}\\'s own {name} package was imported')\n"
        )
    importable = tmp_path / "importable"
    importable.mkdir()
    (importable / "streamrl").symlink_to(ROOT / "streamrl")
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "STREAMRL_REDIS_PASSWORD")}
    env["PYTHONPATH"] = str(importable)
    return project, env
