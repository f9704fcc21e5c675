"""How a run's files are created and trusted: private to their owner, never written through a
link, read only from a directory no other user can change.

The run-directory policy, which every command that writes or reads its own run's ``run.dir``
applies at its start, before it loads a model or reaches Redis: ``enter_run_dir`` (a writer:
``run``, ``learner``, ``actors``, ``broker``, ``sft``, ``dpo``, ``dashboard``) or
``check_run_dir`` (a reader of its own run: ``scale``, ``export``'s checkpoint). A refusal is a
ConfigError naming ``run.dir`` and why, and leaves the directory as it was.

- ``check_trusted``: only this user can change ``run.dir`` and the directories above it (a
  sticky one, ``/tmp``, aside): a run re-reads its config, its Redis URL and its checkpoints
  there, so another user's directory could hand it theirs.
- The directories a command writes below ``run.dir`` (``dirs``: ``logs``, ``redis``,
  ``checkpoints``, ``hosts/<host_id>/logs``, ...) are real directories of this user, never a
  link: a link planted there would send its files elsewhere. Missing ones, ``run.dir`` and the
  directories above it included, are made 0700 (0755 with ``run.shared_read``).
- ``restrict_umask``: what the process and the programs it starts write there (logs, step
  rows, checkpoints, the exported policy, TensorBoard files, Redis's files) is its owner's only
  (0600/0700), or readable by all with ``run.shared_read`` (0644/0755), never writable by
  others.
- ``write_new`` writes a whole file under an exclusive temporary name and renames it into
  place: a file or symlink planted at the name is replaced, never written through;
  ``open_append`` refuses a link; ``read_run_file`` reads only a regular file of this user that
  no other may write (``redis.url``, ``run.json``, ``scale.key``).
"""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import BinaryIO

from streamrl.configs.errors import ConfigError


def umask_for(shared_read: bool) -> int:
    return 0o022 if shared_read else 0o077


def restrict_umask(shared_read: bool) -> None:
    """The process's umask for a run (inherited by every process it starts)."""
    os.umask(umask_for(shared_read))


def open_append(path: str | os.PathLike, binary: bool = False):
    """``path`` opened to append (a log, step rows), made if missing with the umask's mode; a
    symlink at ``path`` is refused (OSError), not written through."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(path, flags, 0o644)
    return os.fdopen(fd, "ab" if binary else "a")


def write_new(path: str | os.PathLike, text: str | bytes, *, shared_read: bool = False) -> None:
    """Write ``text`` to ``path`` atomically: 0600 (0644 with ``shared_read``) from the first byte."""
    path = Path(path)
    data = text.encode() if isinstance(text, str) else text
    # mkstemp: O_CREAT | O_EXCL (a planted link at the name fails it), mode 0600
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            if shared_read:
                os.fchmod(f.fileno(), 0o644)
            f.write(data)
        # rename replaces a link at ``path`` itself, not what it points to
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


RUN_DIR_ADVICE = (
    "another user could swap the config or the checkpoint a run loads there. Set a run.dir of "
    "your own (under your home directory), or make it yours and not writable by others"
)


def check_trusted(
    run_dir: str | os.PathLike, key: str = "run.dir", advice: str = RUN_DIR_ADVICE
) -> None:
    """Raise ConfigError, saying why, then ``advice``, unless only this user can change
    ``run_dir`` and the directories above it; ``key`` names it in the message.

    The directory (the path as given and the one it resolves to) must be this user's and
    writable by nobody else; each directory above must be this user's or root's and writable
    by nobody else, unless it is sticky (``/tmp``: nobody may rename another's entries there).
    A symlink on the way must be this user's or root's. Parts that do not exist are skipped:
    whoever makes them makes them this user's.
    """
    for path in dict.fromkeys((Path(os.path.abspath(run_dir)), Path(os.path.realpath(run_dir)))):
        for node in (path, *path.parents):
            try:
                st = os.lstat(node)
            except FileNotFoundError:
                continue
            why = _fault(st, own=node == path and not stat.S_ISLNK(st.st_mode), above=node != path)
            if why:
                what = key if node == path else f"{node}, a directory above {key},"
                raise ConfigError(f"{key} {str(run_dir)!r}: {what} {why}; {advice}")


def _fault(st: os.stat_result, own: bool, above: bool = False) -> str | None:
    """Why another user could change what ``st`` describes (None: nobody could): it is not this
    user's (``own``; else root's will do), or others may write it (a sticky directory above
    the run's aside). A symlink's mode means nothing: only its owner counts."""
    uid = os.geteuid()
    mode = st.st_mode
    if st.st_uid not in ((uid,) if own else (uid, 0)):
        return f"is owned by uid {st.st_uid}, not by you (uid {uid})"
    if stat.S_ISLNK(mode) or not mode & 0o022 or (above and mode & stat.S_ISVTX):
        return None
    who = "group and others" if mode & 0o002 else "its group"
    return f"is writable by {who} (mode {stat.S_IMODE(mode):o})"


def check_run_dir(
    run_dir: str | os.PathLike, *, dirs: Iterable[str] = (), key: str = "run.dir"
) -> Path:
    """``run_dir`` as a Path, or ConfigError (having changed nothing) when it is a file, is not
    trusted (``check_trusted``), or one of ``dirs`` (paths below it) that exists, or a part of
    one, is a link, not a directory, or not this user's alone."""
    path = Path(run_dir)
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{key} {str(run_dir)!r} is a file, not a directory")
    check_trusted(path, key)
    for below in dirs:
        _below(path, below, key, make=None)
    return path


def enter_run_dir(
    run_dir: str | os.PathLike,
    shared_read: bool,
    *,
    dirs: Iterable[str] = (),
    key: str = "run.dir",
) -> Path:
    """The policy a command that writes in ``run_dir`` applies at its start: ``check_run_dir``
    (ConfigError, naming ``key``, before anything is made), then ``restrict_umask`` (inherited by
    every process it starts); then ``run_dir``, the directories above it and ``dirs`` below it
    that are missing are made 0700 (0755 with ``shared_read``) whatever the umask, an existing
    part of ``dirs`` checked again as it is walked, never followed."""
    dirs = tuple(dirs)
    path = check_run_dir(run_dir, dirs=dirs, key=key)
    restrict_umask(shared_read)
    mode = 0o755 if shared_read else 0o700
    for missing in reversed([p for p in (path, *path.parents) if not p.exists()]):
        _mkdir(missing, mode)
    for below in dirs:
        _below(path, below, key, make=mode)
    return path


def _mkdir(path: Path, mode: int) -> None:
    path.mkdir(mode=mode)
    # whatever the umask
    path.chmod(mode)


def _below(run_dir: Path, below: str, key: str, make: int | None) -> None:
    """Walk ``below`` (a relative path) down from ``run_dir`` without following a link; parts
    that are missing are made with mode ``make``, or end the walk when it is None."""
    node = run_dir
    for part in Path(below).parts:
        if part in ("", ".", "..", "/"):
            raise ConfigError(f"{key} {str(run_dir)!r}: {below!r} is not a path below it")
        node = node / part
        try:
            st = os.lstat(node)
        except FileNotFoundError:
            if make is None:
                return
            _mkdir(node, make)
            continue
        what = f"{key} {str(run_dir)!r}: {node.relative_to(run_dir)}"
        if stat.S_ISLNK(st.st_mode):
            raise ConfigError(
                f"{what} is a symlink (to {os.readlink(node)!r}); streamrl follows no link in a "
                "run directory, since one planted there would send the run's files elsewhere: "
                "remove it (put the whole run.dir where its files should go)"
            )
        if not stat.S_ISDIR(st.st_mode):
            raise ConfigError(f"{what} is not a directory: move it away")
        why = _fault(st, own=True)
        if why:
            raise ConfigError(f"{what} {why}: make it yours and not writable by others")


def open_regular(path: str | os.PathLike, what: str, advice: str) -> BinaryIO:
    """``path`` opened to read (binary), a regular file at the path itself. ConfigError saying
    ``what`` it is, then ``advice``, for a link there (never followed) or anything but a regular
    file (a FIFO is not waited on, a device not read); FileNotFoundError when there is none."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            raise
        raise ConfigError(
            f"{what} is a symbolic link (symlink to {os.readlink(path)!r}){advice}"
        ) from None
    f = os.fdopen(fd, "rb")
    if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
        f.close()
        raise ConfigError(f"{what} is not a regular file{advice}")
    return f


def read_run_file(run_dir: str | os.PathLike, name: str, key: str = "run.dir") -> str:
    """The text of ``run_dir/name``, a file a run wrote for its other processes (its Redis URL,
    its supervisor's pid and key). ConfigError, naming ``key``, unless ``run_dir`` is trusted
    (``check_trusted``) and the file is a regular file of this user that no other may write,
    not a link; FileNotFoundError when there is none."""
    check_trusted(run_dir, key)
    what = f"{key} {str(run_dir)!r}: {name}"
    advice = ", so it is not a file a run of yours wrote: remove it"
    with open_regular(Path(run_dir) / name, what, advice) as f:
        why = _fault(os.fstat(f.fileno()), own=True)
        if why:
            raise ConfigError(f"{what} {why}{advice}")
        return f.read().decode(errors="replace")
