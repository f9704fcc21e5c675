"""What a new run does with the directory ``run.dir`` already names: resume, start, or refuse.

Nothing here deletes what a run did not write. A directory holding a checkpoint is
resumed (verl's ``resume_mode: auto``): the learner continues from it and the earlier
checkpoints, steps and exported policy stay. An earlier run's steps without a
checkpoint to continue from is refused, since a fresh start would mix two runs' rows in one
log. ``--overwrite`` is the one way to start over, and it removes only the entries
streamrl writes in a run directory (``RUN_ENTRIES``) of a directory a run marked as its own
(``MARKER``, the first thing a run writes there, with its run id); anything else there is kept
and named. A directory another live supervisor runs in is refused either way.

A run trusts its directory: every process re-reads ``config.yaml`` there and resumes from the
checkpoint ``latest`` names. So the run-directory policy every command applies
(``configs.runfiles``) comes first here too: a directory that another local user owns or may
write, or that sits below such a directory (short of a sticky one, ``/tmp``), or whose
``dirs`` are links, is refused before anything in it is read, and a new one is made 0700 (0755
with ``run.shared_read``).
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import uuid
from collections.abc import Iterable
from pathlib import Path

from streamrl.configs.errors import ConfigError
from streamrl.configs.runfiles import check_run_dir, enter_run_dir, write_new

CHECKPOINTS = "checkpoints"
STEPS_LOG = "learner_steps.jsonl"
RUN_FILE = "run.json"
# {"run_id": ...}: a run made this directory, so --overwrite may remove its RUN_ENTRIES
MARKER = ".streamrl-run"
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
        # the supervisor's key for scale commands (launch.control)
        "scale.key",
        "agent",
        "plots",
        MARKER,
    }
)


def checkpoint_step(run_dir: Path) -> int | None:
    """The step of the newest complete checkpoint under ``run_dir`` (None: there is none).

    Raises ConfigError when ``latest`` names anything but a checkpoint folder beside it."""
    root = run_dir / CHECKPOINTS
    link = root / "latest"
    if not link.is_symlink():
        return None
    target = os.readlink(link)
    folder = root / target
    if (
        "/" in target
        or not target.startswith("step-")
        or folder.is_symlink()
        or not folder.is_dir()
    ):
        raise ConfigError(
            f"{link} points at {target!r}, not at a checkpoint folder in {root}: "
            "remove the link (or the run directory) by hand"
        )
    return int(target.removeprefix("step-").split(".")[0])


def live_supervisor(run_dir: Path) -> int | None:
    """The pid of a streamrl supervisor still running in ``run_dir`` (not this process), if any."""
    try:
        pid = int(json.loads((run_dir / RUN_FILE).read_text())["supervisor_pid"])
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return pid if pid != os.getpid() and b"streamrl" in cmdline else None


def prepare(
    run_dir: Path,
    overwrite: bool = False,
    resume: bool = False,
    shared_read: bool = False,
    dirs: Iterable[str] = (),
) -> str:
    """Decide what this run does with ``run_dir``, then enter it with ``dirs`` below it
    (``configs.runfiles.enter_run_dir``: the process's umask set, what is missing made); returns
    a line saying what.

    Raises ConfigError, having changed nothing, when the directory is not trusted
    (``check_run_dir``), holds a live run, holds an earlier run's steps with no checkpoint (and
    no ``overwrite``), holds entries a run writes with no marker saying a run wrote them, or
    ``resume`` is asked for with no checkpoint to resume from.
    """
    dirs = tuple(dirs)
    check_run_dir(run_dir, dirs=dirs)
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
        elif unmarked := _unmarked_entries(run_dir):
            raise ConfigError(
                f"run.dir {str(run_dir)!r} holds {', '.join(unmarked)}, names a run writes, "
                f"but no {MARKER}, the mark of a directory a streamrl run made (an older "
                "streamrl, or not streamrl, wrote them): move them away or set another run.dir"
            )
        elif (run_dir / STEPS_LOG).exists():
            raise ConfigError(
                f"run.dir {str(run_dir)!r} holds an earlier run's steps ({STEPS_LOG}) but no "
                "checkpoint to resume from: pass --overwrite to start over there (it removes only "
                "what streamrl wrote), or set another run.dir"
            )
        else:
            said = f"new run in {run_dir}"
    enter_run_dir(run_dir, shared_read, dirs=dirs)
    if overwrite or run_id(run_dir) is None:
        # the first entry of a run, so --overwrite later knows the rest is the run's
        write_new(run_dir / MARKER, json.dumps({"run_id": uuid.uuid4().hex}) + "\n")
    return said


def run_id(run_dir: Path) -> str | None:
    """The id in ``run_dir``'s marker (None: no marker, so no run made the directory)."""
    marker = run_dir / MARKER
    try:
        if not stat.S_ISREG(os.lstat(marker).st_mode):
            return None
        return str(json.loads(marker.read_text())["run_id"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _unmarked_entries(run_dir: Path) -> list[str]:
    """The entries a run writes that ``run_dir`` holds without a marker."""
    if not run_dir.is_dir() or run_id(run_dir) is not None:
        return []
    return sorted(e.name for e in run_dir.iterdir() if e.name in RUN_ENTRIES)


def _remove_run_entries(run_dir: Path) -> str:
    if not run_dir.exists():
        return f"new run in {run_dir} (--overwrite: nothing to remove)"
    if run_dir.is_symlink():
        raise ConfigError(
            f"--overwrite: run.dir {str(run_dir)!r} is a symlink; --overwrite does not follow "
            f"one: set run.dir to {os.path.realpath(run_dir)!r} if that is the run's"
        )
    unmarked = _unmarked_entries(run_dir)
    if unmarked:
        raise ConfigError(
            f"--overwrite: run.dir {str(run_dir)!r} has no {MARKER}, the mark of a directory a "
            f"streamrl run made (an older streamrl, or not streamrl, wrote it), so nothing was "
            f"removed; --overwrite would have removed {', '.join(unmarked)}. Remove those "
            "yourself if they are an old run's, or set another run.dir"
        )
    removed, kept = [], []
    for entry in sorted(run_dir.iterdir()):
        if entry.name == MARKER:
            continue
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
