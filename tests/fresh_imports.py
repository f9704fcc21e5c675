"""Test helper: which modules a piece of code imports, run in an interpreter of its own (this
one has imported everything the suite has)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# what a light module (a registry, the config schema) must not pull in
HEAVY = frozenset({"torch", "numpy", "vllm", "transformers"})


def modules_after(code: str) -> set[str]:
    """The names in ``sys.modules`` once ``code`` has run in a fresh interpreter at the
    repository root."""
    run = subprocess.run(
        [sys.executable, "-c", f"{code}\nimport sys\nprint(sorted(sys.modules))"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert run.returncode == 0, run.stderr
    return set(ast.literal_eval(run.stdout.splitlines()[-1]))


def heavy(modules: set[str]) -> set[str]:
    """The packages of ``HEAVY`` that ``modules`` holds."""
    return {m.split(".")[0] for m in modules} & HEAVY
