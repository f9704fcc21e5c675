"""The launcher's dataset check, once per set of inputs.

Loading the dataset as an actor does (every row validated and tokenized) costs the launcher
torch, transformers and datasets imports: ~2.7 CPU-s, next to children that need every core to
start. When the data file and the model folder are local, a stamp named by their identity
(path, size, modification time of the data file and of every file of the model folder, the
``data`` section, and the prompt loader's own source) records that these exact inputs passed,
and later launches skip the check. Any edit to them changes the name. The actors check the data
again as they load it, so a stamp can only move where an error shows, never let bad rows train.

Stamps live in ``$XDG_CACHE_HOME/streamrl/checked`` (``~/.cache``), a folder of this user's.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from streamrl.configs.schema import Config


def stamp_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "streamrl" / "checked"


def _identity(path: Path) -> list:
    info = path.stat()
    return [str(path.resolve()), info.st_size, info.st_mtime_ns]


def stamp(cfg: Config) -> Path | None:
    """The stamp of ``cfg``'s dataset and tokenizer; None when either is not a local file/folder
    (a hub id resolves through the network or its cache: checked every time)."""
    from streamrl.actors import prompt_data

    data, model = Path(cfg.data.path), Path(cfg.model.path)
    if not data.is_file() or not model.is_dir():
        return None
    parts = [
        cfg.data.model_dump(mode="json"),
        cfg.rollout.chat_template_kwargs,
        _identity(data),
        [_identity(f) for f in sorted(model.iterdir()) if f.is_file()],
        hashlib.sha256(Path(prompt_data.__file__).read_bytes()).hexdigest(),
    ]
    key = hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()
    return stamp_dir() / key


def check_dataset(cfg: Config) -> bool:
    """Load the dataset as an actor does unless these inputs passed before; raises its
    ``PromptDataError`` (naming file and row). Returns whether it loaded it."""
    done = stamp(cfg)
    if done is not None and done.is_file():
        return False
    from streamrl.actors.prompt_data import PromptDataset
    from streamrl.policy.load import load_tokenizer

    PromptDataset.from_config(
        cfg.data,
        load_tokenizer(cfg.model.path),
        template_kwargs=cfg.rollout.chat_template_kwargs,
    )
    if done is not None:
        done.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        done.touch()
    return True
