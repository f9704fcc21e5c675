"""Run untrusted Python (model-written code) in a contained subprocess.

``layers()`` says which of the layers below this host actually granted; the
first ``run_python`` logs it once. Each layer, and how strong it is:

- **Resources (kernel):** rlimits on CPU seconds, address space (``memory_mb``),
  output file size, open files, no core files; the work dir's total size is
  counted every ``DISK_POLL_S`` and the program killed past ``disk_mb``.
- **Process tree (kernel):** the program runs as pid 1 of its own pid namespace
  (``unshare --pid --fork --kill-child``). The sandbox process carries
  ``PR_SET_PDEATHSIG=SIGKILL``, so whoever dies first (the timeout here, or the
  reward pool SIGKILLing its worker) takes the namespace down, and the kernel
  kills every process in it, double-forked and ``setsid`` ones included. A work
  dir whose owner died is removed by the next ``run_python`` on the host.
- **Namespaces (kernel):** a fresh network namespace (only a downed loopback: no
  Redis, no Internet) and a fresh ``/proc`` that shows only the sandbox's own
  processes. As root this needs nothing more; as another user it needs
  unprivileged user namespaces (the program then runs as the same uid, mapped
  into its own user namespace).
- **Identity (kernel, root actors only):** the program drops to a fresh
  unprivileged uid of its own (no account behind it), so file permissions keep it
  out of everything it does not own and ``RLIMIT_NPROC`` caps its processes.
- **Landlock (kernel, Linux >= 5.13, any user):** writes, file creation and
  removal only beneath its work dir; no TCP bind/connect (ABI >= 4); no signals
  or abstract unix sockets outside the sandbox (ABI >= 6).
- **Seccomp (kernel, x86_64 and aarch64, any user):** ``socket`` (so no unix
  socket, pathname or abstract, and no TCP), ``execve``, ``fork`` and non-thread
  ``clone``, ``ptrace``, ``io_uring``, namespaces and mounts fail with EPERM.
- **Interpreter (best effort, not a security boundary):** ``python -I -S -B`` with
  an empty environment and an audit hook that refuses sockets, fork/exec,
  ``ctypes``, writes outside the work dir, other processes' ``/proc`` entries and
  its own memory, tracing, hand-made code objects, and the introspection that
  reaches frames' code or the hook (``gc`` object walks, ``f_code``, ``gi_code``,
  ``tb_frame``; a function's own ``__code__`` and defaults stay readable). Its settings
  are constants of its own code, and it resolves paths with primitives captured
  when it was installed, so rebinding a global or a module attribute (``os.fspath``,
  ``os.path.realpath``) changes nothing it checks. Gaps: a path-like object whose
  ``__fspath__`` answers differently on each call, and native code (an extension
  module loaded through the import machinery's internals, a bug in CPython), get
  past it; the kernel layers above are what hold then.

What is not kept: without unprivileged user namespaces, Landlock and seccomp a
non-root actor gets rlimits, the disk count and the audit hook only (``layers()``
says so); the program can read any file the actor's user can read (no read
allow-list). Use a VM or gVisor for workloads that are hostile on purpose.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import math
import os
import platform
import resource
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
from dataclasses import asdict, dataclass

log = logging.getLogger(__name__)

NOBODY = 65534
# far above real accounts; each run draws its own uid from here
SANDBOX_UID_BASE = 1 << 30
SANDBOX_UIDS = 1 << 24
KILL_ROUNDS = 50
MAX_OUTPUT_BYTES = 1 << 20
NPROC_LIMIT = 16
PR_SET_PDEATHSIG = 1
LANDLOCK_CREATE_RULESET_VERSION = 1
# the same number on x86_64 and aarch64 (generic table)
SYS_LANDLOCK_CREATE_RULESET = 444
WORKDIR_PREFIX = "streamrl-sandbox-"
# The seccomp filter per machine: (audit arch, x32 numbers exist, syscalls refused with EPERM,
# clone, clone3). Refused: socket (unix sockets too: neither the network namespace nor Landlock
# stops a connect to a pathname unix socket), execve/execveat, fork/vfork, ptrace and
# process_vm_*, io_uring (its operations bypass seccomp), unshare/setns/mount, bpf, userfaultfd,
# open_by_handle_at.
SECCOMP_TABLES = {
    "x86_64": (
        0xC000003E,
        True,
        (41, 59, 322, 57, 58, 101, 310, 311, 425, 426, 427, 272, 308, 165, 321, 323, 304),
        56,
        435,
    ),
    "aarch64": (
        0xC00000B7,
        False,
        (198, 221, 281, 117, 270, 271, 425, 426, 427, 97, 268, 40, 280, 282, 265),
        220,
        435,
    ),
}
NONCE_BYTES = 16
DISK_MB = 64
DISK_POLL_S = 0.05
# Tried in order; the first that starts a program on this host is used (user namespace first:
# it is what lets a non-root process create the others).
NAMESPACE_FLAGS = (
    ("--map-current-user", "--net", "--pid", "--fork", "--kill-child", "--mount-proc"),
    ("--map-current-user", "--net", "--pid", "--fork", "--kill-child"),
    ("--map-current-user", "--net"),
)

# Runs first in the child, before any user code; argv: program file. The work dir, the hook
# switch and the Landlock ABI are pasted in as literals, so nothing user code can rebind
# (a global, a module attribute) changes what the hook checks.
_BOOT = r"""
import sys

def _landlock(root, abi):
    import ctypes, os, struct
    libc = ctypes.CDLL(None, use_errno=True)
    fs = 0x2 | 0x10 | 0x20 | 0x40 | 0x80 | 0x100 | 0x200 | 0x400 | 0x800 | 0x1000
    fs |= (0x2000 if abi >= 2 else 0) | (0x4000 if abi >= 3 else 0)
    attr = struct.pack("QQQ", fs, 0x3 if abi >= 4 else 0, 0x3 if abi >= 6 else 0)
    attr = attr[: 8 if abi < 4 else 16 if abi < 6 else 24]
    ruleset = libc.syscall(ctypes.c_long(444), attr, ctypes.c_size_t(len(attr)), ctypes.c_uint32(0))
    if ruleset < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset")
    beneath = os.open(root, os.O_PATH | os.O_DIRECTORY)
    rule = struct.pack("=Qi", fs, beneath)
    if libc.syscall(ctypes.c_long(445), ctypes.c_int(ruleset), ctypes.c_int(1), rule,
                    ctypes.c_uint32(0)) != 0:
        raise OSError(ctypes.get_errno(), "landlock_add_rule")
    if libc.prctl(38, ctypes.c_ulong(1), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0)):
        raise OSError(ctypes.get_errno(), "PR_SET_NO_NEW_PRIVS")
    if libc.syscall(ctypes.c_long(446), ctypes.c_int(ruleset), ctypes.c_uint32(0)) != 0:
        raise OSError(ctypes.get_errno(), "landlock_restrict_self")
    os.close(beneath)
    os.close(ruleset)

def _seccomp(table):
    # A classic-BPF filter: wrong architecture (e.g. 32-bit syscalls on x86_64) kills; socket,
    # exec, fork and non-thread clone fail with EPERM; clone3 fails with ENOSYS, so the C
    # library falls back to clone, whose flags the filter can read (threads keep working).
    import ctypes, struct
    arch, x32, eperm, clone, clone3 = table
    ld, jeq, jset, jge, ret = 0x20, 0x15, 0x45, 0x35, 0x06
    allow, deny, kill = 0x7FFF0000, 0x00050000 | 1, 0x80000000
    prog = [(ld, 0, 0, 4), (jeq, 1, 0, arch), (ret, 0, 0, kill), (ld, 0, 0, 0)]
    if x32:
        prog += [(jge, 0, 1, 0x40000000), (ret, 0, 0, kill)]
    for nr in eperm:
        prog += [(jeq, 0, 1, nr), (ret, 0, 0, deny)]
    prog += [(jeq, 0, 1, clone3), (ret, 0, 0, 0x00050000 | 38)]
    # clone: allowed only with CLONE_THREAD (args[0], low word at offset 16)
    prog += [(jeq, 0, 4, clone), (ld, 0, 0, 16), (jset, 1, 0, 0x10000), (ret, 0, 0, deny),
             (ret, 0, 0, allow)]
    prog += [(ret, 0, 0, allow)]
    raw = b"".join(struct.pack("=HBBI", *op) for op in prog)
    buf = ctypes.create_string_buffer(raw, len(raw))
    fprog = struct.pack("=HxxxxxxQ", len(prog), ctypes.addressof(buf))
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(38, ctypes.c_ulong(1), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0)):
        raise OSError(ctypes.get_errno(), "PR_SET_NO_NEW_PRIVS")
    if libc.prctl(22, ctypes.c_ulong(2), ctypes.c_char_p(fprog), ctypes.c_ulong(0),
                  ctypes.c_ulong(0)):
        raise OSError(ctypes.get_errno(), "PR_SET_SECCOMP")

def _sealed(tests_path, fd):
    # The appended tests, compiled with a last statement that prints a nonce read from ``fd``
    # (then closed) before any program code runs. The nonce lives only in this code object's
    # constants: it sits on the boot's evaluation stack while the program runs and is the tests'
    # frame's f_code while they run, both out of reach of Python code under the hook (f_code,
    # gi_code, tb_frame, gc, tracing, hand-made code objects and ctypes are refused).
    import ast, os
    source = open(tests_path).read()
    tree = ast.parse(source, tests_path)
    mark = b"\n" + os.read(fd, 64) + b"\n"
    os.close(fd)
    # numbered as the line after the tests
    write = ast.parse("\n" * source.count("\n") + "\n__import__('os').write(1, b'')").body[0]
    write.value.args[1] = ast.Constant(mark)
    tree.body.append(write)
    return compile(ast.fix_missing_locations(tree), tests_path, "exec")

def _install_hook():
    import os, stat

    def resolve(path, lstat=os.lstat, readlink=os.readlink, getcwd=os.getcwd,
                fsdecode=os.fsdecode, islink=stat.S_ISLNK, reversed=reversed, list=list,
                isinstance=isinstance, bytes=bytes, OSError=OSError):
        # realpath from captured primitives: rebinding os.fspath, os.path.realpath or
        # posixpath._joinrealpath cannot change it
        if isinstance(path, bytes):
            path = path.decode("utf-8", "surrogateescape")
        elif not isinstance(path, str):
            path = fsdecode(path)
        if not path.startswith("/"):
            path = getcwd() + "/" + path
        todo, real, links = list(reversed(path.split("/"))), "", 0
        while todo:
            part = todo.pop()
            if part in ("", "."):
                continue
            if part == "..":
                real = real.rpartition("/")[0]
                continue
            candidate = real + "/" + part
            try:
                is_link = islink(lstat(candidate).st_mode)
            except OSError:
                is_link = False
            if not is_link:
                real = candidate
                continue
            links += 1
            if links > 40:
                return "/"
            target = readlink(candidate)
            if target.startswith("/"):
                real = ""
            todo.extend(reversed(target.split("/")))
        return real or "/"

    def fd_dir(fd, readlink=os.readlink, OSError=OSError):
        try:
            return readlink(f"/proc/self/fd/{fd}")
        except OSError:
            return "/"

    def hook(event, args, resolve=resolve, fd_dir=fd_dir, getpid=os.getpid, fsdecode=os.fsdecode,
             isinstance=isinstance, str=str, bytes=bytes, int=int, any=any,
             PermissionError=PermissionError):
        # a function's own code and defaults (dataclasses and inspect read them) lead to no frame
        # and to no enclosing code object: frame, traceback and generator attributes stay refused
        if event == "object.__getattr__" and args[1] in ("__code__", "__defaults__",
                                                         "__kwdefaults__"):
            return
        if event.startswith(("socket.", "subprocess.", "os.fork", "os.forkpty", "os.exec",
                             "os.posix_spawn", "os.spawn", "os.system", "os.kill", "os.killpg",
                             "ctypes.", "pty.", "gc.get_", "sys._current_frames",
                             "object.__getattr__", "sys.settrace", "sys.setprofile",
                             "sys.monitoring", "sys._setprofileallthreads",
                             "sys._settraceallthreads", "code.__new__")):
            raise PermissionError(f"sandbox: {event} is not allowed")
        if event == "import" and args[0] in ("ctypes", "_ctypes", "_posixsubprocess"):
            raise PermissionError(f"sandbox: import {args[0]} is not allowed")
        if event == "open":
            path, mode, flags = args
            if isinstance(path, int):
                return
            writes = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                isinstance(flags, int) and flags & 0o3103)
            if isinstance(path, bytes):
                path = path.decode("utf-8", "surrogateescape")
            elif not isinstance(path, str):
                path = fsdecode(path)
            # os.open's event (mode None) omits dir_fd, so a relative path there could name
            # any directory: refused, open() or an absolute path work
            if mode is None and not path.startswith("/"):
                raise PermissionError(f"sandbox: os.open of a relative path {path!r}")
            real = resolve(path)
            inside = real == @ROOT@ or real.startswith(@ROOT@ + "/")
            if writes and not inside:
                raise PermissionError(f"sandbox: writing {path!r} outside the sandbox directory")
            own = f"/proc/{getpid()}/"
            if real.startswith("/proc/") and (not real.startswith(own) or real.endswith("/mem")
                                              or "/map_files" in real):
                raise PermissionError(f"sandbox: reading {path!r} is not allowed")
        elif event in ("os.remove", "os.rename", "os.mkdir", "os.rmdir", "os.symlink", "os.link",
                       "os.truncate", "os.chmod", "os.chown", "os.utime", "shutil.rmtree",
                       "shutil.copyfile", "shutil.move"):
            # the events' trailing ints are dir_fds: a relative path is resolved against its
            # directory (/proc/self/fd), not the working directory
            dir_fds = [a for a in args[2:] if isinstance(a, int) and a >= 0]
            for i, arg in enumerate(args[:2]):
                if isinstance(arg, (str, bytes)):
                    if dir_fds and not (arg.startswith("/") if isinstance(arg, str)
                                        else arg.startswith(b"/")):
                        base = fd_dir(dir_fds[min(i, len(dir_fds) - 1)])
                        arg = base + "/" + (arg if isinstance(arg, str) else arg.decode(
                            "utf-8", "surrogateescape"))
                    real = resolve(arg)
                    if not (real == @ROOT@ or real.startswith(@ROOT@ + "/")):
                        raise PermissionError(f"sandbox: {event} outside the sandbox directory")

    sys.addaudithook(hook)

_source = open(sys.argv[1]).read()
if @LANDLOCK@:
    _landlock(@ROOT@, @LANDLOCK@)
if @SECCOMP@:
    _seccomp(@SECCOMP@)
for _name in [m for m in sys.modules if m.startswith(("ctypes", "_ctypes"))]:
    del sys.modules[_name]
if @HOOK@:
    _install_hook()
del _landlock, _seccomp, _install_hook
_code = compile(_source, sys.argv[1], "exec")
_ns = {"__name__": "__main__", "__file__": sys.argv[1]}
_tests = sys.argv[2:3]
sys.argv = sys.argv[1:2]
if _tests:
    # argument order: the sealed tests are compiled (nonce read) before the program runs
    exec(_sealed(_tests[0], @NONCE_FD@), [exec(_code, _ns), _ns][1])
else:
    exec(_code, _ns)
"""


def _boot(root: str, audit_hook: bool, landlock_abi: int, seccomp: bool, nonce_fd: int) -> str:
    return (
        _BOOT.replace("@ROOT@", repr(root))
        .replace("@HOOK@", repr(audit_hook))
        .replace("@LANDLOCK@", repr(landlock_abi))
        .replace("@SECCOMP@", repr(SECCOMP_TABLES.get(platform.machine()) if seccomp else None))
        .replace("@NONCE_FD@", repr(nonce_fd))
    )


@dataclass
class SandboxResult:
    # None when killed on timeout
    returncode: int | None
    stdout: str
    stderr: str
    timed_out: bool
    # whether the kernel network namespace was in place
    network_namespace: bool
    # with ``tests``: whether they ran to their last statement (the nonce came back); else None
    tests_completed: bool | None = None
    # killed for passing ``disk_mb`` in its work dir (or hiding a folder from the count)
    disk_exceeded: bool = False

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out and self.tests_completed is not False


@dataclass(frozen=True)
class Layers:
    """The containment this host grants the sandbox (probed once per process)."""

    interpreter: str
    # root actor: the program runs as a fresh uid of its own
    uid_drop: bool
    # of "user", "net", "pid", "proc"
    namespaces: tuple[str, ...]
    # 0: no Landlock
    landlock_abi: int
    # a seccomp filter refuses sockets, exec, fork (x86_64 and aarch64)
    seccomp: bool = False
    pdeathsig: bool = True
    audit_hook: bool = True

    @property
    def unshare_flags(self) -> tuple[str, ...]:
        for flags in NAMESPACE_FLAGS:
            if _names(flags) == self.namespaces:
                return flags
        return ()


_LIBC = ctypes.CDLL(None, use_errno=True)


def _names(flags: tuple[str, ...]) -> tuple[str, ...]:
    names = {"--map-current-user": "user", "--net": "net", "--pid": "pid", "--mount-proc": "proc"}
    return tuple(names[f] for f in flags if f in names)


def _preexec(timeout_s: float, memory_mb: int, uid: int | None):
    cpu = max(1, int(timeout_s) + 1)

    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
        resource.setrlimit(resource.RLIMIT_AS, (memory_mb << 20, memory_mb << 20))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        resource.setrlimit(resource.RLIMIT_FSIZE, (MAX_OUTPUT_BYTES * 8, MAX_OUTPUT_BYTES * 8))
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
        if uid is not None:
            resource.setrlimit(resource.RLIMIT_NPROC, (NPROC_LIMIT, NPROC_LIMIT))
            _drop_to(uid)
        # After the uid change (which clears it): the sandbox dies with the thread that started it,
        # e.g. a reward worker the pool SIGKILLs at its own timeout.
        _LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)

    return apply


def _drop_to(uid: int) -> None:
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)


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


def _landlock_abi() -> int:
    abi = _LIBC.syscall(
        ctypes.c_long(SYS_LANDLOCK_CREATE_RULESET),
        None,
        ctypes.c_size_t(0),
        ctypes.c_uint32(LANDLOCK_CREATE_RULESET_VERSION),
    )
    return max(abi, 0)


def _starts(command: list[str], uid: int | None) -> bool:
    try:
        return (
            subprocess.run(
                command,
                capture_output=True,
                timeout=30,
                cwd="/",
                preexec_fn=_preexec(30, 512, uid),
            ).returncode
            == 0
        )
    except (OSError, subprocess.SubprocessError):
        return False


def _seccomp_installs(interpreter: str, uid: int | None) -> bool:
    """Whether the boot's seccomp filter installs here (a known machine, a kernel and a container
    runtime that allow it), tried in a throwaway process as the program would run."""
    table = SECCOMP_TABLES.get(platform.machine())
    if table is None:
        return False
    probe = _BOOT.split("def _sealed")[0] + f"_seccomp({table!r})\n"
    return _starts([interpreter, "-I", "-S", "-c", probe], uid)


@functools.cache
def layers() -> Layers:
    """Probe (once per process) which containment layers this host grants, and log them.

    As root the program drops to a fresh uid, which needs an interpreter that uid can
    run: a venv under /root is not, so the system python3 is tried next (the sandbox
    needs the standard library only). If none runs, the program stays root.
    """
    root = os.geteuid() == 0
    probe_uid = SANDBOX_UID_BASE + secrets.randbelow(SANDBOX_UIDS) if root else None
    check = ["-I", "-S", "-c", "import sys; sys.exit(sys.version_info < (3, 8))"]
    interpreter, uid_drop = sys.executable, False
    if root:
        for candidate in (sys.executable, shutil.which("python3", path="/usr/bin:/bin")):
            if candidate and _starts([candidate, *check], probe_uid):
                interpreter, uid_drop = candidate, True
                break
    uid = probe_uid if uid_drop else None
    unshare = shutil.which("unshare", path="/usr/bin:/bin:/usr/sbin:/sbin")
    namespaces: tuple[str, ...] = ()
    for flags in NAMESPACE_FLAGS if unshare else ():
        if _starts([unshare, *flags, interpreter, *check], uid):
            namespaces = _names(flags)
            break
    seccomp = _seccomp_installs(interpreter, uid)
    granted = Layers(interpreter, uid_drop, namespaces, _landlock_abi(), seccomp)
    log.info("sandbox layers: %s", asdict(granted))
    return granted


def _sweep_orphaned_workdirs() -> None:
    """Remove work dirs whose owning process died without cleaning up (e.g. a SIGKILLed worker).

    Only directories this process may own: created by our uid (or, as root, chowned to
    a sandbox uid) and named for a pid that no longer exists.
    """
    base = tempfile.gettempdir()
    for name in os.listdir(base):
        if not name.startswith(WORKDIR_PREFIX):
            continue
        owner = name[len(WORKDIR_PREFIX) :].split("-", 1)[0]
        path = os.path.join(base, name)
        try:
            info = os.lstat(path)
        except FileNotFoundError:
            continue
        ours = info.st_uid == os.geteuid() or (
            os.geteuid() == 0 and SANDBOX_UID_BASE <= info.st_uid < SANDBOX_UID_BASE + SANDBOX_UIDS
        )
        if not (stat.S_ISDIR(info.st_mode) and ours and owner.isdigit()):
            continue
        if not _pid_alive(int(owner)):
            shutil.rmtree(path, ignore_errors=True)


# os.kill rather than psutil: this module runs under a bare interpreter too (the sandbox tests
# import it as an unprivileged user with the system python), so it needs the standard library only
def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def run_python(
    code: str,
    stdin: str = "",
    timeout_s: float = 5.0,
    memory_mb: int = 512,
    audit_hook: bool = True,
    tests: str | None = None,
    disk_mb: int = DISK_MB,
) -> SandboxResult:
    """Run ``code`` as a program in the sandbox and return its exit status and (truncated) output.

    ``tests``: Python run in the program's namespace after it; the result is ``ok`` only if
    they ran to their end. Their last statement prints a nonce drawn per call and handed over a
    pipe that the boot reads and closes before the program starts; the program never sees it,
    so exiting early (``sys.exit``, ``os._exit``, ``atexit``, closing stdout) cannot pass.
    ``disk_mb``: the work dir's size (allocated blocks) is counted every ``DISK_POLL_S`` and the
    program killed past it (``RLIMIT_FSIZE`` bounds one file only).
    ``audit_hook=False`` leaves only the kernel-enforced layers (tests check each layer alone).
    """
    granted = layers()
    _sweep_orphaned_workdirs()
    workdir = os.path.realpath(tempfile.mkdtemp(prefix=f"{WORKDIR_PREFIX}{os.getpid()}-"))
    try:
        uid = SANDBOX_UID_BASE + secrets.randbelow(SANDBOX_UIDS) if granted.uid_drop else None
        files = _write_files(workdir, code, tests, uid)
        nonce, nonce_fd = _nonce_pipe() if tests is not None else (b"", -1)
        command = _command(granted, workdir, audit_hook, nonce_fd, files)
        env = {"HOME": workdir, "TMPDIR": workdir, "LANG": "C.UTF-8", "PYTHONIOENCODING": "utf-8"}
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            proc = subprocess.Popen(
                command,
                stdin=subprocess.PIPE,
                stdout=out,
                stderr=err,
                cwd=workdir,
                env=env,
                start_new_session=True,
                preexec_fn=_preexec(timeout_s, memory_mb, uid),
                close_fds=True,
                pass_fds=(nonce_fd,) if tests is not None else (),
            )
            if tests is not None:
                os.close(nonce_fd)
            disk = _DiskWatch(workdir, disk_mb << 20, proc.pid)
            timed_out = _wait(proc, stdin, timeout_s, disk, uid)
            stdout, completed = _read(out), None
            if tests is not None:
                stdout, completed = _unmark(out, b"\n" + nonce + b"\n")
            return SandboxResult(
                returncode=None if timed_out else proc.returncode,
                stdout=stdout,
                stderr=_read(err),
                timed_out=timed_out,
                network_namespace="net" in granted.namespaces,
                tests_completed=completed,
                disk_exceeded=disk.exceeded,
            )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _write_files(workdir: str, code: str, tests: str | None, uid: int | None) -> list[str]:
    """Write the program (and the tests) into ``workdir``, all owned by ``uid`` when it drops to
    one; returns their paths, the program first."""
    files = {os.path.join(workdir, "main.py"): code}
    if tests is not None:
        files[os.path.join(workdir, "tests.py")] = tests
    for path, text in files.items():
        with open(path, "w") as f:
            f.write(text)
        if uid is not None:
            os.chown(path, uid, uid)
    if uid is not None:
        os.chown(workdir, uid, uid)
    return list(files)


def _nonce_pipe() -> tuple[bytes, int]:
    """A fresh nonce and the read end of a pipe holding it (the boot reads it, then closes it)."""
    nonce = secrets.token_hex(NONCE_BYTES).encode()
    read_end, write_end = os.pipe()
    os.write(write_end, nonce)
    os.close(write_end)
    return nonce, read_end


def _command(
    granted: Layers, workdir: str, audit_hook: bool, nonce_fd: int, files: list[str]
) -> list[str]:
    """The interpreter running the boot on ``files``, inside the namespaces this host grants."""
    boot = _boot(workdir, audit_hook, granted.landlock_abi, granted.seccomp, nonce_fd)
    command = [granted.interpreter, "-I", "-S", "-B", "-c", boot, *files]
    if granted.namespaces:
        unshare = shutil.which("unshare", path="/usr/bin:/bin:/usr/sbin:/sbin")
        command = [unshare, *granted.unshare_flags, *command]
    return command


def _wait(
    proc: subprocess.Popen, stdin: str, timeout_s: float, disk: _DiskWatch, uid: int | None
) -> bool:
    """Feed ``stdin`` and wait up to ``timeout_s``, then kill whatever is left of the program;
    whether it timed out."""
    timed_out = False
    try:
        proc.communicate(stdin.encode(), timeout=timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
    finally:
        disk.stop()
        _kill_group(proc.pid)
        if uid is not None:
            _kill_uid(uid)
        proc.wait(timeout=10)
    return timed_out


class _DiskWatch:
    """Counts the work dir's allocated bytes every DISK_POLL_S on a thread of its own and kills
    the program's process group past the cap. Between two counts the program writes at disk
    speed; a file deleted while still open is not seen (at most RLIMIT_NOFILE x RLIMIT_FSIZE)."""

    def __init__(self, workdir: str, cap: int, pgid: int):
        self.workdir, self.cap, self.pgid = workdir, cap, pgid
        self.exceeded = False
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="sandbox-disk", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._done.wait(DISK_POLL_S):
            if _allocated(self.workdir) > self.cap:
                self.exceeded = True
                _kill_group(self.pgid)
                return

    def stop(self) -> None:
        self._done.set()
        self._thread.join()


def _allocated(root: str) -> float:
    """Bytes allocated beneath ``root``; infinite when a folder cannot be listed (the program
    made one unreadable to hide what it holds)."""
    total, todo = 0, [root]
    while todo:
        try:
            with os.scandir(todo.pop()) as entries:
                for entry in entries:
                    try:
                        info = entry.stat(follow_symlinks=False)
                    except FileNotFoundError:
                        continue
                    total += info.st_blocks * 512
                    if stat.S_ISDIR(info.st_mode):
                        todo.append(entry.path)
        except FileNotFoundError:
            continue
        except PermissionError:
            return math.inf
    return total


def _kill_group(pgid: int) -> None:
    """SIGKILL the sandbox's process group; with a pid namespace that takes down every process in it."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _read(f) -> str:
    f.seek(0)
    return f.read(MAX_OUTPUT_BYTES).decode("utf-8", errors="replace")


def _unmark(f, mark: bytes) -> tuple[str, bool]:
    """The output without the tests' end mark, and whether it was there (anywhere: output the
    program buffered may follow it)."""
    f.seek(0)
    data = f.read()
    found = mark in data
    kept = data.replace(mark, b"\n", 1) if found else data
    return kept[:MAX_OUTPUT_BYTES].decode("utf-8", errors="replace"), found
