"""Append-only JSONL logs a process keeps in its run directory: the learner's step rows, the
actors' evaluations, and the opt-in delivery audit of what crossed the broker (groups published,
per actor: ``published_path``; groups committed by a learner step: ``commits_path``).

One line per record, flushed per line so a SIGKILLed writer loses at most the line it was writing
(readers skip a torn last line). The chaos harness checks delivery against the audit: every
published group id must be committed by exactly one checkpoint step, or still be in the stream, or
have been wiped by a Redis restart without persistence.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from streamrl.configs.runfiles import open_append, open_regular

PUBLISHED_DIR = "published"
COMMITS_FILE = "learner_commits.jsonl"


def published_path(run_dir: str | os.PathLike, actor_id: str) -> Path:
    return Path(run_dir) / PUBLISHED_DIR / f"{actor_id}.jsonl"


def commits_path(run_dir: str | os.PathLike) -> Path:
    return Path(run_dir) / COMMITS_FILE


class JsonlLog:
    """Append-only JSONL file; ``write`` returns once the line is in the OS page cache."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # closed in close()
        self._file = open_append(self.path)

    def write(self, record: dict) -> None:
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def read_jsonl(path: str | os.PathLike) -> list[dict]:
    """Every complete record; a torn last line (writer killed mid-write) is skipped.

    Raises ConfigError for anything but a regular file at ``path`` itself: a reader of another
    user's run (``streamrl plot``, ``inspect``) never follows a link planted there, nor blocks on
    a FIFO or reads a device without end."""
    try:
        with open_regular(path, str(path), ": not read") as f:
            text = f.read().decode(errors="replace")
    except FileNotFoundError:
        return []
    records = []
    for line in text.splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records
