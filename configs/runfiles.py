"""How a run's files are created and trusted: private to their owner, never written through a
link, read only from a directory no other user can change.

Every streamrl process sets its umask with ``restrict_umask`` before it writes in ``run.dir``, so
what it and the programs it starts write there (logs, step rows, checkpoints, TensorBoard
files, Redis's files) is its owner's only (0600/0700), or readable by all with
``run.shared_read`` (0644/0755), never writable by others. ``write_new`` writes a whole file
under an exclusive temporary name and renames it into place: a file or symlink someone planted
at the name is replaced, never written through. ``check_trusted`` refuses a directory another local user could change:
a run re-reads its config and unpickles its checkpoints there.
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

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


def check_trusted(run_dir: str | os.PathLike, key: str = "run.dir") -> None:
    """Raise ConfigError, saying why, unless only this user can change ``run_dir`` and the
    directories above it; ``key`` names it in the message.

    The directory (the path as given and the one it resolves to) must be this user's and
    writable by nobody else; each directory above must be this user's or root's and writable
    by nobody else, unless it is sticky (``/tmp``: nobody may rename another's entries there).
    A symlink on the way must be this user's or root's. Parts that do not exist are skipped:
    whoever makes them makes them this user's.
    """
    uid = os.geteuid()
    for path in dict.fromkeys((Path(os.path.abspath(run_dir)), Path(os.path.realpath(run_dir)))):
        for node in (path, *path.parents):
            try:
                st = os.lstat(node)
            except FileNotFoundError:
                continue
            mode = st.st_mode
            why = None
            if st.st_uid not in ((uid,) if node == path and not stat.S_ISLNK(mode) else (uid, 0)):
                why = f"is owned by uid {st.st_uid}, not by you (uid {uid})"
            elif stat.S_ISLNK(mode):
                continue
            elif mode & 0o022 and (node == path or not mode & stat.S_ISVTX):
                why = f"is writable by {'group and others' if mode & 0o002 else 'its group'} (mode {stat.S_IMODE(mode):o})"
            if why:
                what = key if node == path else f"{node}, a directory above {key},"
                raise ConfigError(
                    f"{key} {str(run_dir)!r}: {what} {why}; another user could swap the config "
                    "or the checkpoint a run loads there. Set a run.dir of your own (under your "
                    "home directory), or make it yours and not writable by others"
                )
