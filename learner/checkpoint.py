"""Resumable checkpoints with an atomic switch.

Layout under ``<run.dir>/checkpoints``::

    step-00000004.0/state/...   DeepSpeed files: weights, each rank's ZeRO optimizer partition, LR schedule
    step-00000004.0/rng-0.pt    per-rank RNG state (torch, numpy, random)
    latest -> step-00000004.0   symlink, replaced with os.replace once every rank has written

Every save writes a folder of its own (a re-save of the same step gets the next
suffix), so the folder ``latest`` names is never written to or removed: a crash
while saving leaves ``latest`` on the previous complete checkpoint. After the
switch the previous one is kept too (the last two), everything else is removed.
The client state (version, counters, the stream entries this checkpoint
covers but has not acked yet) rides in DeepSpeed's ``client_state``.
"""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

TAG = "state"
LATEST = "latest"


def _barrier() -> None:
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _rng_state() -> dict:
    return {
        "torch": torch.get_rng_state(),
        "numpy": np.random.get_state(),
        "python": random.getstate(),
    }


def _set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])


def _saves_of(root: Path, step: int) -> list[int]:
    """Suffixes of the folders of ``step`` (one per save of that step, complete or not)."""
    prefix = f"step-{step:08d}."
    return [
        int(p.name[len(prefix) :])
        for p in root.glob(prefix + "*")
        if p.name[len(prefix) :].isdigit()
    ]


def save(engine, root: str | os.PathLike, step: int, client_state: dict, rank: int) -> Path:
    """Collective: every rank calls it. Returns the checkpoint folder once ``latest`` points at it."""
    root = Path(root)
    if rank == 0:
        root.mkdir(parents=True, exist_ok=True)
        (root / f"step-{step:08d}.{max(_saves_of(root, step), default=-1) + 1}").mkdir()
    _barrier()
    # Rank 0 made the newest folder of this step before the barrier: every rank names the same one.
    folder = root / f"step-{step:08d}.{max(_saves_of(root, step))}"
    engine.save_checkpoint(str(folder), tag=TAG, client_state=client_state, save_latest=False)
    torch.save(_rng_state(), folder / f"rng-{rank}.pt")
    _barrier()
    if rank == 0:
        for path in folder.rglob("*"):
            if path.is_file():
                with open(path, "rb") as f:
                    os.fsync(f.fileno())
        before = root / LATEST
        previous = os.readlink(before) if before.is_symlink() else None
        link = root / (LATEST + ".tmp")
        if link.is_symlink() or link.exists():
            link.unlink()
        os.symlink(folder.name, link)
        os.replace(link, root / LATEST)
        _fsync_dir(root)
        for old in root.glob("step-*"):
            if old.name not in (folder.name, previous):
                shutil.rmtree(old, ignore_errors=True)
    _barrier()
    return folder


def step_of(folder: str | os.PathLike) -> int:
    """The training step a checkpoint folder (``step-00000004.0``) holds."""
    return int(Path(folder).name.removeprefix("step-").split(".")[0])


def latest(root: str | os.PathLike) -> Path | None:
    link = Path(root) / LATEST
    return link.resolve() if link.is_symlink() else None


def load(engine, root: str | os.PathLike, rank: int) -> dict | None:
    """Collective. Restore the newest complete checkpoint; returns its client state, or None if there is none."""
    folder = latest(root)
    if folder is None:
        return None
    path, client_state = engine.load_checkpoint(str(folder), tag=TAG)
    if path is None:
        raise RuntimeError(f"checkpoint {folder} could not be loaded")
    rng_file = folder / f"rng-{rank}.pt"
    if rng_file.exists():
        _set_rng_state(torch.load(rng_file, weights_only=False))
    return client_state
