"""Which GPUs and CPU cores each supervised child gets: its ``CUDA_VISIBLE_DEVICES``, from
``learner.gpus`` and ``actor.gpus``, and the cores it pins itself to once started, from
``learner.cpus`` and ``actor.cpus`` (``cpu_sets``; the child applies them: ``runtime.cpu_pinning.pin_assigned``).

Indices in the config count the devices the launcher itself sees: its own ``CUDA_VISIBLE_DEVICES``
when set (so ``learner.gpus: [0]`` under ``CUDA_VISIBLE_DEVICES=4,5`` is physical GPU 4), else
every GPU of the host. A child's value is written in the launcher's own terms (ids, UUIDs or MIG
names pass through unchanged). The learner process gets all of its ranks' GPUs and rank r takes
``cuda:r`` of them (``LOCAL_RANK``), one GPU per rank; actor i gets the (i mod n)-th group of
``actor.gpus_per_actor`` indices, so more actors than groups share them round-robin.
The schema checks the lists against each other (``Config._placement``); ``check`` checks them
against the devices present. The supervisor records what it gave in ``<run.dir>/placement.json``,
which the live view and ``streamrl inspect`` show. Imports the config schema (and torch, to count GPUs).
"""

from __future__ import annotations

import errno
import glob
import json
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from streamrl.configs.runfiles import write_new
from streamrl.configs.schema import Config

PLACEMENT_FILE = "placement.json"
# far more than any run's placement; a bigger file is not one
MAX_FILE_BYTES = 1 << 20


class PlacementError(ValueError):
    """A GPU index names a device the launcher does not see."""


def launcher_devices(env: Mapping[str, str] = os.environ) -> list[str] | None:
    """The launcher's ``CUDA_VISIBLE_DEVICES`` as a list (empty: no GPU), or None when unset (all GPUs)."""
    raw = env.get("CUDA_VISIBLE_DEVICES")
    if raw is None:
        return None
    return [d.strip() for d in raw.split(",") if d.strip()]


def actor_gpus(cfg: Config, index: int) -> list[int] | None:
    """The GPU indices of supervised actor ``index`` (a0 = 0), or None without placement.

    Under a transport whose actors open the learner's GPU memory (``device_ipc``: cuda_ipc) an
    actor on GPUs of its own sees the learner's GPU too, after its own: its engine keeps
    ``cuda:0`` (and its tensor-parallel ``cuda:1..``), and the slots open on the learner's GPU
    by its UUID (``weightsync.transports.cuda_ipc.device``), read by a peer copy."""
    gpus = cfg.actor.gpus
    if gpus is None:
        return None
    learner_gpu = cfg.learner.gpus[0] if cfg.learner.gpus else 0
    if gpus == "share":
        return [learner_gpu]
    tp = cfg.actor.gpus_per_actor
    group = index % (len(gpus) // tp)
    own = gpus[group * tp : (group + 1) * tp]
    from streamrl.weightsync import transports

    if transports.get(cfg.weightsync.transport).device_ipc:
        return [*own, learner_gpu]
    return own


def visible_devices(indices: list[int], launcher: list[str] | None) -> str:
    """The ``CUDA_VISIBLE_DEVICES`` value that shows a child exactly ``indices`` of the launcher's devices."""
    return ",".join(str(i) if launcher is None else launcher[i] for i in indices)


def check(cfg: Config, available: int, learner_here: bool = True) -> None:
    """Every configured index names one of the ``available`` devices the launcher sees, and, when
    the learner runs here too (``streamrl run``, not an actors host), the actors' GPUs are not
    the learner's."""
    if learner_here and isinstance(cfg.actor.gpus, list):
        # unplaced, learner rank r takes cuda:r of the devices it inherits
        learner = cfg.learner.gpus
        learner_gpus = learner if learner is not None else list(range(cfg.learner.ranks))
        shared = sorted(set(cfg.actor.gpus) & set(learner_gpus))
        if shared:
            raise PlacementError(
                f"actor.gpus={cfg.actor.gpus} and the learner's GPUs {learner_gpus} "
                f"(learner.gpus={learner}) share GPU(s) {shared}: give them disjoint GPUs, or "
                'actor.gpus="share" to put the actors on the learner\'s GPU'
            )
    for key, gpus in (("learner.gpus", cfg.learner.gpus), ("actor.gpus", cfg.actor.gpus)):
        if not isinstance(gpus, list):
            continue
        missing = [i for i in gpus if i >= available]
        if missing:
            raise PlacementError(
                f"{key}={gpus} names GPU(s) {missing}, but the launcher sees {available} GPU(s) "
                "(indices count its CUDA_VISIBLE_DEVICES when set, else the host's GPUs)"
            )
    if cfg.actor.gpus == "share" and available < 1:
        raise PlacementError('actor.gpus="share" needs a GPU, but the launcher sees none')
    if cfg.actor.gpus == "share":
        from streamrl.weightsync import transports

        # NCCL refuses two ranks of one communicator on one GPU
        if transports.get(cfg.weightsync.transport).group_backend(cfg.weightsync) not in (
            None,
            "gloo",
        ):
            raise PlacementError(
                'actor.gpus="share" puts learner and actors on one GPU, where NCCL cannot join '
                f"them (weightsync.transport={cfg.weightsync.transport}): use weightsync.transport=shm"
            )


def check_launcher(cfg: Config, launcher: list[str] | None, learner_here: bool = True) -> None:
    """``check`` against the devices the launcher sees (nothing to count without placement), and
    on an actors host ``check_actors_host``."""
    if not learner_here:
        check_actors_host(cfg)
    if cfg.learner.gpus is not None or cfg.actor.gpus is not None:
        check(cfg, gpu_count(launcher), learner_here)


def check_actors_host(cfg: Config) -> None:
    """An actors host (``streamrl actors``, the learner elsewhere) cannot take weights over a
    transport that opens the learner's GPU memory."""
    from streamrl.weightsync import transports

    if transports.get(cfg.weightsync.transport).device_ipc:
        raise PlacementError(
            f"weightsync.transport={cfg.weightsync.transport} copies weights from the learner's GPU "
            "on its own host, and the learner does not run here: use weightsync.transport=dist "
            "(with weightsync.dist.relay) for actors on other hosts"
        )


def gpu_count(launcher: list[str] | None) -> int:
    """How many devices the launcher sees: its CUDA_VISIBLE_DEVICES, else what CUDA reports."""
    if launcher is not None:
        return len(launcher)
    import torch

    return torch.cuda.device_count()


def launcher_cpus() -> list[int]:
    """The CPU cores the launcher may run on (its affinity), in order: ``*.cpus`` index these."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def nvidia_present(launcher: list[str] | None) -> bool:
    """Whether the launcher sees an NVIDIA GPU, without importing torch (whose import would delay
    every child's start): its CUDA_VISIBLE_DEVICES when set, else the driver's device files."""
    if launcher is not None:
        return bool(launcher)
    return bool(glob.glob("/dev/nvidia[0-9]*"))


@dataclass(frozen=True)
class CpuSets:
    """Physical core ids each role pins itself to once started; None = not pinned."""

    learner: tuple[int, ...] | None
    actors: tuple[int, ...] | None

    def for_actor(self, cfg: Config, index: int) -> tuple[int, ...] | None:
        from streamrl.actors import engines

        # "auto" leaves alone an engine that binds its own threads to cores (vLLM)
        if cfg.actor.cpus == "auto" and engines.get(cfg.actor.engine_of(index)).places_own_threads:
            return None
        return self.actors

    def describe(self) -> str:
        """``learner: CPU 0 · actors: CPU 1`` (``all`` for a role that is not pinned)."""
        return f"learner: {_cores(self.learner)} · actors: {_cores(self.actors)}"


def _cores(cpus: tuple[int, ...] | None) -> str:
    return "all" if cpus is None else "CPU " + ",".join(map(str, cpus))


def cpu_sets(cfg: Config, available: list[int], gpu_host: bool) -> CpuSets:
    """The cores of ``learner.cpus`` and ``actor.cpus`` among ``available`` (the launcher's,
    ``launcher_cpus``); ``gpu_host``: ``nvidia_present``. Raises PlacementError for an index
    past the available cores."""
    learner = _listed("learner.cpus", cfg.learner.cpus, available)
    need = cfg.learner.ranks * cfg.run.torch_threads
    if cfg.learner.cpus == "auto" and not gpu_host and len(available) > need:
        learner = tuple(available[:need])
    actors = _listed("actor.cpus", cfg.actor.cpus, available)
    if cfg.actor.cpus == "auto" and learner is not None:
        actors = tuple(c for c in available if c not in learner) or None
    return CpuSets(learner, actors)


def _listed(key: str, cpus, available: list[int]) -> tuple[int, ...] | None:
    """The cores an index list names; None for "auto" and None."""
    if not isinstance(cpus, list):
        return None
    missing = [i for i in cpus if i >= len(available)]
    if missing:
        raise PlacementError(
            f"{key}={cpus} names core index(es) {missing}, but the launcher may use "
            f"{len(available)} core(s) ({','.join(map(str, available))}; indices count them in order)"
        )
    return tuple(available[i] for i in cpus)


def write(run_dir: Path, placement: dict[str, str | None]) -> None:
    """``{child name: its CUDA_VISIBLE_DEVICES, or None when inherited}``, replaced atomically."""
    write_new(run_dir / PLACEMENT_FILE, json.dumps(placement, indent=2) + "\n")


def read(run_dir: str | os.PathLike, host: str | None = None) -> dict[str, str | None] | None:
    """The placement a supervisor recorded in ``run_dir`` (``host``: that host's supervisor, in
    ``hosts/<host>``), or None (no supervised run there).

    ``run_dir`` may be another user's and ``host`` comes from Redis, so both are data: ValueError
    for a host that is not one name, or a link, or anything but a small regular file on the way
    (``run_dir`` itself, named by the user, is the one path followed)."""
    parts = [PLACEMENT_FILE]
    if host is not None:
        if host in ("", ".", "..") or "/" in host or "\0" in host:
            raise ValueError(f"host {host!r} is not a host name: its placement is not read")
        # ``launch.host.host_dir``'s layout (which imports this module)
        parts = ["hosts", host, PLACEMENT_FILE]
    try:
        data = json.loads(_read_inside(Path(run_dir), parts))
    # missing, or not readable by this user
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return None
    if not isinstance(data, dict):
        return None
    return {str(k): v if v is None else str(v) for k, v in data.items()}


def _read_inside(top: Path, parts: list[str]) -> bytes:
    """``top/parts...`` read with each part opened below the last (openat), no link followed."""
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for part in parts[:-1]:
            below = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = below
        leaf = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=fd)
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            raise
        raise ValueError(f"a link on the way to {top.joinpath(*parts)}: not followed") from exc
    finally:
        os.close(fd)
    with os.fdopen(leaf, "rb") as f:
        info = os.fstat(leaf)
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_FILE_BYTES:
            raise ValueError(f"{top.joinpath(*parts)} is not a small regular file")
        return f.read(MAX_FILE_BYTES)


def describe(placement: Mapping[str, str | None]) -> str:
    """``learner: GPU 0 · a0: GPU 1 · a1: GPU 1`` (``inherited`` for a child without placement)."""
    return " · ".join(
        f"{name}: {'inherited' if devices is None else f'GPU {devices}'}"
        for name, devices in placement.items()
    )
