"""Run untrusted Python (model-written code) in a contained subprocess.

Isolation, layer by layer, and how strong each one is:

- **Resources (kernel-enforced):** rlimits on CPU seconds, address space
  (``memory_mb``), output file size, open files and no core files; a wall-clock
  timeout kills the whole process group (``start_new_session`` + ``killpg``).
- **Network (kernel-enforced where permitted):** the child enters a fresh network
  namespace (``unshare(CLONE_NEWNET)``: only a downed loopback). This needs root
  or unprivileged user namespaces; where the kernel refuses, only the audit hook
  below blocks sockets.
- **Identity (kernel-enforced when the actor runs as root):** the child drops to
  a fresh unprivileged uid/gid of its own (no account behind it, like ``nobody``
  but one per run), so it cannot read other processes' ``/proc/*/environ`` or
  write files owned by others, and ``RLIMIT_NPROC`` caps its processes (root
  ignores that limit, hence the drop). Because the uid is the run's alone, the
  end of a run kills every process of that uid (``kill(-1)`` from a helper
  running as it): a grandchild that double-forked and left the process group
  with ``setsid`` dies too. As a non-root actor the child keeps the actor's
  uid, NPROC is not lowered (it counts all of the user's threads) and only the
  process group is killed.
- **Interpreter (best effort, not a security boundary):** ``python -I -S -B``
  with an empty environment (only ``HOME``/``TMPDIR`` = its own temp dir, which
  is also the cwd) and a ``sys.addaudithook`` installed before the code runs
  that refuses sockets, fork/exec/spawn, ``ctypes``, writes outside the temp dir
  and reads of other processes' ``/proc`` entries. Audit hooks cannot be removed
  from Python, but native code could bypass them; use a VM or gVisor for
  hostile workloads.
"""

from __future__ import annotations

import ctypes
import functools
import os
import resource
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass

NOBODY = 65534
SANDBOX_UID_BASE = 1 << 30  # far above real accounts; each run draws its own uid from here
SANDBOX_UIDS = 1 << 24
KILL_ROUNDS = 50
CLONE_NEWNET = 0x40000000
MAX_OUTPUT_BYTES = 1 << 20
NPROC_LIMIT = 16

# Runs first in the child (before any user code); argv: program file, temp dir, "1" = install the hook.
_BOOT = r"""
import os, sys
_root = os.path.realpath(sys.argv[2])
_pid = os.getpid()
_WRITE = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
_BLOCKED = ("socket.", "subprocess.", "os.fork", "os.forkpty", "os.exec", "os.posix_spawn", "os.spawn",
            "os.system", "os.kill", "os.killpg", "ctypes.", "pty.")
_PATHS = ("os.remove", "os.rename", "os.mkdir", "os.rmdir", "os.symlink", "os.link", "os.truncate",
          "os.chmod", "os.chown", "os.utime", "shutil.rmtree", "shutil.copyfile", "shutil.move")

def _inside(path):
    if isinstance(path, int):
        return True
    real = os.path.realpath(os.fsdecode(path))
    return real == _root or real.startswith(_root + os.sep)

def _hook(event, args):
    if event.startswith(_BLOCKED):
        raise PermissionError(f"sandbox: {event} is not allowed")
    if event == "import" and args[0] in ("ctypes", "_ctypes", "_posixsubprocess"):
        raise PermissionError(f"sandbox: import {args[0]} is not allowed")
    if event == "open":
        path, mode, flags = args
        writes = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
            isinstance(flags, int) and flags & _WRITE)
        if writes and not _inside(path):
            raise PermissionError(f"sandbox: writing {path!r} outside the sandbox directory")
        if isinstance(path, (str, bytes)):
            real = os.path.realpath(os.fsdecode(path))
            if real.startswith("/proc/") and not real.startswith(f"/proc/{_pid}/"):
                raise PermissionError(f"sandbox: reading {path!r} is not allowed")
    elif event in _PATHS and not all(_inside(a) for a in args[:2] if isinstance(a, (str, bytes))):
        raise PermissionError(f"sandbox: {event} outside the sandbox directory")

_source = open(sys.argv[1]).read()
if sys.argv[3] == "1":
    sys.addaudithook(_hook)
sys.argv = sys.argv[1:2]
exec(compile(_source, sys.argv[0], "exec"), {"__name__": "__main__", "__file__": sys.argv[0]})
"""


@dataclass
class SandboxResult:
    returncode: int | None  # None when killed on timeout
    stdout: str
    stderr: str
    timed_out: bool
    network_namespace: bool  # whether the kernel network namespace was in place

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out


_LIBC = ctypes.CDLL(None, use_errno=True)


def _limits(timeout_s: float, memory_mb: int, uid: int | None):
    cpu = max(1, int(timeout_s) + 1)

    def apply() -> None:  # runs in the child between fork and exec
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
        resource.setrlimit(resource.RLIMIT_AS, (memory_mb << 20, memory_mb << 20))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        resource.setrlimit(resource.RLIMIT_FSIZE, (MAX_OUTPUT_BYTES * 8, MAX_OUTPUT_BYTES * 8))
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
        _LIBC.unshare(
            CLONE_NEWNET
        )  # refused without privileges: then only the audit hook blocks sockets
        if uid is not None:
            resource.setrlimit(resource.RLIMIT_NPROC, (NPROC_LIMIT, NPROC_LIMIT))
            _drop_to(uid)

    return apply


def _drop_to(uid: int) -> None:
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)


def _drop_to_nobody() -> None:
    _drop_to(NOBODY)


def _kill_uid(uid: int) -> None:
    """SIGKILL every process of the run's uid, wherever it went (another session, reparented to init).

    A forked helper becomes that uid and calls kill(-1): the kernel delivers it to
    exactly the processes that uid may signal, i.e. its own. Repeated until none is
    left, so a process forked during one sweep dies in the next (NPROC bounds them).
    """
    pid = os.fork()
    if pid == 0:
        try:
            _drop_to(uid)
            for _ in range(KILL_ROUNDS):
                os.kill(-1, signal.SIGKILL)
        except ProcessLookupError:
            os._exit(0)
        except BaseException:
            os._exit(1)
        os._exit(1)
    os.waitpid(pid, 0)


@functools.cache
def _setup() -> tuple[str, bool, bool]:
    """(interpreter, drop to nobody, network namespace available), probed once per process.

    As root the child drops to nobody, which needs an interpreter nobody can run:
    a venv under /root is not, so the system python3 is tried next (the sandbox
    needs the standard library only). If none runs as nobody, the child stays root.
    """
    netns = (
        subprocess.run(
            [
                sys.executable,
                "-I",
                "-S",
                "-c",
                "import ctypes,sys; sys.exit(ctypes.CDLL(None).unshare(0x40000000) != 0)",
            ],
            capture_output=True,
            timeout=30,
        ).returncode
        == 0
    )
    if os.geteuid() != 0:
        return sys.executable, False, netns
    for candidate in (sys.executable, shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin")):
        if candidate is None:
            continue
        try:
            probe = subprocess.run(
                [candidate, "-I", "-S", "-c", "import sys; sys.exit(sys.version_info < (3, 8))"],
                capture_output=True,
                timeout=30,
                preexec_fn=_drop_to_nobody,
                cwd="/",
            )
        except OSError:
            continue
        if probe.returncode == 0:
            return candidate, True, netns
    return sys.executable, False, netns


def run_python(
    code: str,
    stdin: str = "",
    timeout_s: float = 5.0,
    memory_mb: int = 512,
    audit_hook: bool = True,
) -> SandboxResult:
    """Run ``code`` as a program in the sandbox and return its exit status and (truncated) output.

    ``audit_hook=False`` leaves only the kernel-enforced layers (tests check each layer alone).
    """
    interpreter, drop, netns = _setup()
    workdir = tempfile.mkdtemp(prefix="streamrl-sandbox-")
    try:
        program = os.path.join(workdir, "main.py")
        with open(program, "w") as f:
            f.write(code)
        uid = SANDBOX_UID_BASE + secrets.randbelow(SANDBOX_UIDS) if drop else None
        if uid is not None:
            os.chown(workdir, uid, uid)
            os.chown(program, uid, uid)
        env = {"HOME": workdir, "TMPDIR": workdir, "LANG": "C.UTF-8", "PYTHONIOENCODING": "utf-8"}
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            proc = subprocess.Popen(
                [
                    interpreter,
                    "-I",
                    "-S",
                    "-B",
                    "-c",
                    _BOOT,
                    program,
                    workdir,
                    "1" if audit_hook else "0",
                ],
                stdin=subprocess.PIPE,
                stdout=out,
                stderr=err,
                cwd=workdir,
                env=env,
                start_new_session=True,
                preexec_fn=_limits(timeout_s, memory_mb, uid),
                close_fds=True,
            )
            timed_out = False
            try:
                proc.communicate(stdin.encode(), timeout=timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
            finally:
                _kill_group(proc.pid)
                if uid is not None:
                    _kill_uid(uid)
                proc.wait(timeout=10)
            return SandboxResult(
                returncode=None if timed_out else proc.returncode,
                stdout=_read(out),
                stderr=_read(err),
                timed_out=timed_out,
                network_namespace=netns,
            )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _kill_group(pgid: int) -> None:
    """SIGKILL everything the program started (its session is its own process group)."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _read(f) -> str:
    f.seek(0)
    return f.read(MAX_OUTPUT_BYTES).decode("utf-8", errors="replace")
