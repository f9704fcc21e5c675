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

import logging
import os
import random
import secrets
import shutil
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from streamrl.configs.runfiles import check_trusted

TAG = "state"
LATEST = "latest"
# check_shared's probes, under the checkpoint root
PROBES = ".shared-probe"


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
    """Tensors, numbers and tuples only: ``torch.load(weights_only=True)`` reads it back, so
    loading it runs no pickled code."""
    kind, key, pos, has_gauss, cached = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "numpy": (kind, torch.from_numpy(key.astype(np.int64)), pos, has_gauss, cached),
        "python": random.getstate(),
    }


def save_rng(rng_file: Path) -> None:
    torch.save(_rng_state(), rng_file)


def _set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    kind, key, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, key.numpy().astype(np.uint32), pos, has_gauss, cached))
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
    save_rng(folder / f"rng-{rank}.pt")
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


class CheckpointDirNotShared(RuntimeError):
    """The ranks do not see one checkpoint directory: a checkpoint would hold only some ranks' parts."""


def check_shared(
    root: str | os.PathLike, rank: int, world_size: int, device: torch.device, host: str
) -> None:
    """Collective, at start: every rank must see the files every other rank writes under ``root``.

    Each rank writes its own ZeRO partition and RNG state into the checkpoint and reads them back
    on resume, so the learner's nodes need one ``run.dir`` on a filesystem they all mount (NFS,
    Lustre, ...), coherent across nodes between a write and a barrier. Each rank writes a probe
    named after rank 0's token, and reads all the others' after a barrier; any rank missing one
    fails every rank, naming the ranks it cannot see and their hosts.
    """
    if world_size == 1:
        return
    root = Path(root)
    token = [secrets.token_hex(8) if rank == 0 else None]
    dist.broadcast_object_list(token, src=0, device=device)
    probes = root / PROBES / token[0]
    probes.mkdir(parents=True, exist_ok=True)
    (probes / f"rank-{rank}").write_text(host)
    _barrier()
    unseen = [r for r in range(world_size) if not (probes / f"rank-{r}").exists()]
    everyone: list = [None] * world_size
    dist.all_gather_object(everyone, (host, unseen))
    _barrier()
    if rank == 0:
        shutil.rmtree(probes, ignore_errors=True)
    blind = [(r, host, missing) for r, (host, missing) in enumerate(everyone) if missing]
    if blind:
        hosts = {r: host for r, (host, _) in enumerate(everyone)}
        said = "; ".join(
            f"rank {r} on {host} does not see rank(s) {', '.join(f'{m} ({hosts[m]})' for m in missing)}"
            for r, host, missing in blind
        )
        raise CheckpointDirNotShared(
            f"{root} is not one directory for every learner rank ({said}): each rank writes its "
            "part of a checkpoint there, so run.dir must be on a filesystem every learner node "
            "mounts at the same path (docs/multihost.md)"
        )


def step_of(folder: str | os.PathLike) -> int:
    """The training step a checkpoint folder (``step-00000004.0``) holds."""
    return int(Path(folder).name.removeprefix("step-").split(".")[0])


def latest(root: str | os.PathLike) -> Path | None:
    """The folder ``root/latest`` names (None: no checkpoint yet). Raises RuntimeError when the
    link leads anywhere but a checkpoint folder in ``root``: what it names is unpickled."""
    link = Path(root) / LATEST
    if not link.is_symlink():
        return None
    target = os.readlink(link)
    folder = Path(root) / target
    if (
        "/" in target
        or not target.startswith("step-")
        or not folder.is_dir()
        or folder.is_symlink()
    ):
        raise RuntimeError(
            f"{link} points at {target!r}, not at a checkpoint folder in {root}: refusing to load it"
        )
    return folder.resolve()


def load(engine, root: str | os.PathLike, rank: int) -> dict | None:
    """Collective. Restore the newest complete checkpoint; returns its client state, or None if there is none."""
    folder = latest(root)
    if folder is None:
        return None
    # DeepSpeed unpickles its client state: only from a folder no other user could have written
    check_trusted(folder, "checkpoint")
    path, client_state = engine.load_checkpoint(str(folder), tag=TAG)
    if path is None:
        raise RuntimeError(f"checkpoint {folder} could not be loaded")
    restore_rng(folder / f"rng-{rank}.pt")
    return client_state


def restore_rng(rng_file: Path) -> bool:
    """Set this process's RNGs from ``rng_file``, read as data only; False if it holds none."""
    if not rng_file.exists():
        return False
    if torch.serialization.get_unsafe_globals_in_checkpoint(rng_file):
        # an older checkpoint pickled numpy's state: resumed without it rather than unpickled
        logging.warning("%s: an older RNG state format; the RNG is not restored", rng_file)
        return False
    _set_rng_state(torch.load(rng_file, weights_only=True))
    return True
