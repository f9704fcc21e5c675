"""A local Hugging Face hub cache laid out as huggingface_hub lays it out, for offline hub-id tests.

``<root>/hub/<kind>s--<org>--<name>/snapshots/<revision>/<files>`` with ``refs/main`` holding the
revision: what ``snapshot_download`` leaves behind (it stores blobs and links snapshot files to
them; the loaders read snapshot files either way).
"""

from __future__ import annotations

import shutil
from pathlib import Path

REVISION = "0123456789abcdef0123456789abcdef01234567"


def add_to_cache(root: Path, repo_id: str, source: Path, kind: str = "model") -> Path:
    """Copy the files of ``source`` (a folder or one file) into the cache as ``repo_id``'s main."""
    repo = root / "hub" / f"{kind}s--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / REVISION
    snapshot.mkdir(parents=True, exist_ok=True)
    if source.is_dir():
        shutil.copytree(source, snapshot, dirs_exist_ok=True)
    else:
        shutil.copy(source, snapshot / source.name)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(REVISION)
    return snapshot


def hub_env(root: Path, offline: bool = True) -> dict[str, str]:
    """Environment for a child process that sees only this cache (and no network, when offline)."""
    env = {"HF_HOME": str(root), "HF_HUB_CACHE": str(root / "hub")}
    if offline:
        env["HF_HUB_OFFLINE"] = "1"
        env["HF_DATASETS_OFFLINE"] = "1"
    return env
