"""What a folder holds, to compare before and after a command that must change nothing there."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path


def fingerprint(folder: Path) -> dict[str, str]:
    """Every entry under ``folder``: directories by mode, links by target, files by a hash of
    their bytes."""
    out = {}
    for path in sorted(folder.rglob("*")):
        key = str(path.relative_to(folder))
        if path.is_symlink():
            out[key] = "-> " + os.readlink(path)
        elif path.is_dir():
            out[key] = f"dir {stat.S_IMODE(path.stat().st_mode):o}"
        elif path.is_file():
            out[key] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out
