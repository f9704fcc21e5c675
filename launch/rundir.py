"""What a new run does with the directory ``run.dir`` already names: resume, start, or refuse.

Nothing here deletes what a run did not write. A directory holding a checkpoint is
resumed (verl's ``resume_mode: auto``): the learner continues from it and the earlier
checkpoints, steps and exported policy stay. An earlier run's steps without a
checkpoint to continue from is refused, since a fresh start would mix two runs' rows in one
log. ``--overwrite`` is the one way to start over, and it removes only the entries
streamrl writes in a run directory (``RUN_ENTRIES``); anything else there is kept and
named. A directory another live supervisor runs in is refused either way.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from streamrl.configs.errors import ConfigError

CHECKPOINTS = "checkpoints"
STEPS_LOG = "learner_steps.jsonl"
RUN_FILE = "run.json"
# every entry a run writes directly under run.dir (tests/test_run_dir.py checks a real run's)
RUN_ENTRIES = frozenset(
    {
        CHECKPOINTS,
        STEPS_LOG,
        RUN_FILE,
        "config.yaml",
        "logs",
        "redis",
        "redis.url",
        "prometheus",
        "tensorboard",
        "policy",
        "published",
        "learner_commits.jsonl",
        "eval.jsonl",
        "wandb",
        "trackio",
        "tracker.json",
        "placement.json",
    }
)


def checkpoint_step(run_dir: Path) -> int | None:
    """The step of the newest complete checkpoint under ``run_dir`` (None: there is none)."""
    link = run_dir / CHECKPOINTS / "latest"
    if not link.is_symlink() or not link.resolve().is_dir():
        return None
    return int(link.resolve().name.removeprefix("step-").split(".")[0])


def live_supervisor(run_dir: Path) -> int | None:
    """The pid of a streamrl supervisor still running in ``run_dir`` (not this process), if any."""
    try:
        pid = int(json.loads((run_dir / RUN_FILE).read_text())["supervisor_pid"])
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return pid if pid != os.getpid() and b"streamrl" in cmdline else None


def prepare(run_dir: Path, overwrite: bool = False, resume: bool = False) -> str:
    """Decide what this run does with ``run_dir`` and make it ready; returns a line saying what.

    Raises ConfigError, having changed nothing, when the directory holds a live run, holds
    an earlier run's steps with no checkpoint (and no ``overwrite``), or ``resume`` is asked
    for with no checkpoint to resume from.
    """
    if run_dir.exists() and not run_dir.is_dir():
        raise ConfigError(f"run.dir {str(run_dir)!r} is a file, not a directory")
    pid = live_supervisor(run_dir)
    if pid is not None:
        raise ConfigError(
            f"run.dir {str(run_dir)!r}: a run is still running there (supervisor pid {pid}); "
            "stop it first or set another run.dir"
        )
    if overwrite:
        if resume:
            raise ConfigError("--overwrite and --resume contradict each other: pick one")
        said = _remove_run_entries(run_dir)
    else:
        step = checkpoint_step(run_dir)
        if step is not None:
            said = f"resuming from the checkpoint of step {step} in {run_dir} (--overwrite starts over)"
        elif resume:
            raise ConfigError(
                f"--resume: run.dir {str(run_dir)!r} holds no checkpoint to resume from"
            )
        elif (run_dir / STEPS_LOG).exists():
            raise ConfigError(
                f"run.dir {str(run_dir)!r} holds an earlier run's steps ({STEPS_LOG}) but no "
                "checkpoint to resume from: pass --overwrite to start over there (it removes only "
                "what streamrl wrote), or set another run.dir"
            )
        else:
            said = f"new run in {run_dir}"
    run_dir.mkdir(parents=True, exist_ok=True)
    return said


def _remove_run_entries(run_dir: Path) -> str:
    if not run_dir.exists():
        return f"new run in {run_dir} (--overwrite: nothing to remove)"
    removed, kept = [], []
    for entry in sorted(run_dir.iterdir()):
        if entry.name not in RUN_ENTRIES:
            kept.append(entry.name)
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
        removed.append(entry.name)
    said = f"--overwrite: removed {', '.join(removed) or 'nothing'} from {run_dir}"
    return said + (f"; kept what streamrl did not write: {', '.join(kept)}" if kept else "")
