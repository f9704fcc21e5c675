"""Run one command as a check: its output relayed line by line as it comes, a time limit, and
nothing of it left running afterwards, whatever it started.

What it started includes processes in sessions of their own (the supervisor starts the learner and
the actors with ``start_new_session``), which a kill of the command's process group misses, and
processes orphaned when their parent exits, which the kernel hands to init unless the process
running the checks is a subreaper (``become_subreaper``). The end of a check therefore freezes its
whole tree (SIGSTOP, until no new process appears), kills every frozen process, and reaps those
that became ours. Linux only (``/proc``), as the GPU machines are.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

# prctl(2): orphans of our descendants are re-parented to us, not to init
PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> bool:
    """Adopt the orphans of every descendant, so that a check's processes whose parent exited are
    still found (as our children) and reaped; False where the kernel refuses."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _parents() -> dict[int, int]:
    """pid -> parent pid of every live process, read from /proc."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # the command name (in parentheses) may hold spaces and parentheses: fields follow the last
        fields = stat[stat.rindex(")") + 2 :].split()
        found[int(entry.name)] = int(fields[1])
    return found


def descendants(roots: set[int]) -> set[int]:
    """``roots`` that still live and every process below them."""
    parents = _parents()
    children: dict[int, list[int]] = {}
    for pid, parent in parents.items():
        children.setdefault(parent, []).append(pid)
    found, todo = set(), [r for r in roots if r in parents]
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo.extend(children.get(pid, ()))
    return found


def children_of(pid: int) -> set[int]:
    return {p for p, parent in _parents().items() if parent == pid}


def _signal(pids: set[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def end_tree(proc: subprocess.Popen, adopted_before: set[int]) -> int:
    """Kill ``proc``, everything below it and every orphan of it we adopted since
    ``adopted_before`` (our children when it started), then reap; how many were still alive."""
    me = os.getpid()
    roots = {proc.pid} | (children_of(me) - adopted_before)
    frozen: set[int] = set()
    # freeze first: a stopped process can neither exit (orphaning its children) nor start more
    for _ in range(100):
        alive = descendants(roots | frozen) - {me}
        if alive <= frozen:
            break
        _signal(alive - frozen, signal.SIGSTOP)
        frozen |= alive
    _signal(frozen, signal.SIGKILL)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()
    for pid in (children_of(me) - adopted_before) | (frozen & children_of(me)):
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass
    return len(frozen - {proc.pid})


@dataclass
class Finished:
    # None when the time limit ended it
    returncode: int | None
    output: str
    seconds: float
    # processes of it still alive at its end, killed then
    leftovers: int


def run_streamed(
    cmd: list[str], cwd: Path, env: dict[str, str], timeout_s: float, echo: Callable[[str], None]
) -> Finished:
    """Run ``cmd`` in a session of its own, each line of its output (decoded leniently) handed to
    ``echo`` as it comes; at ``timeout_s``, or whatever happens here meanwhile, its whole tree is
    killed and reaped before this returns."""
    lines: list[str] = []
    adopted_before = children_of(os.getpid())
    started = time.monotonic()
    proc = subprocess.Popen(
        cmd, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip

    def relay() -> None:
        for raw in iter(proc.stdout.readline, b""):
            line = raw.decode("utf-8", errors="replace")
            lines.append(line)
            echo(line)

    reader = threading.Thread(target=relay, daemon=True)
    reader.start()
    returncode = None
    try:
        returncode = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        pass
    finally:
        leftovers = end_tree(proc, adopted_before)
        # every writer is dead: the pipe ends, unless a process we could not signal holds it
        reader.join(timeout=10)
        proc.stdout.close()
    return Finished(returncode, "".join(lines), time.monotonic() - started, leftovers)
