"""The code-execution sandbox: each containment layer, with and without the interpreter audit hook,
run by a root actor and by an unprivileged one (a test user is created when the suite runs as root)."""

from __future__ import annotations

import atexit
import functools
import json
import multiprocessing
import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import psutil
import pytest
from accounts import system_user_uid

from streamrl.actors import sandbox
from streamrl.actors.sandbox import SandboxResult, layers, run_python

TEST_USER = "streamrl-sandbox-test"
HOOK = [pytest.param(True, id="all_layers"), pytest.param(False, id="kernel_only")]
AS = [pytest.param("actor", id="as_actor"), pytest.param("user", id="as_user")]

# Runs run_python in a process of the unprivileged test user and prints the result as JSON.
_AS_USER = (
    "import json, sys\n"
    "from dataclasses import asdict\n"
    "from sandbox import run_python, layers\n"
    "kw = json.loads(sys.argv[1])\n"
    "result = run_python(**kw) if kw else None\n"
    "print(json.dumps({'result': result and asdict(result), 'layers': asdict(layers())}))\n"
)


def _test_uid() -> int:
    return system_user_uid(TEST_USER)


@functools.cache
def _module_the_test_user_can_read() -> str:
    """A world-readable copy of the sandbox module (standard library only): the clone may sit
    under a directory the test user cannot enter (a 0700 mktemp folder, /root)."""
    folder = tempfile.mkdtemp(prefix="streamrl-sandbox-module-")
    atexit.register(shutil.rmtree, folder, True)
    os.chmod(folder, 0o755)
    copy = Path(folder) / "sandbox.py"
    shutil.copyfile(sandbox.__file__, copy)
    copy.chmod(0o644)
    return folder


def _as_user(**kwargs) -> dict:
    uid = _test_uid()

    def drop() -> None:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)

    # The venv may sit under /root where the test user cannot go; the sandbox needs only the stdlib.
    interpreter = shutil.which("python3", path="/usr/bin:/bin")
    out = subprocess.run(
        [interpreter, "-c", _AS_USER, json.dumps(kwargs)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd="/",
        env={"PYTHONPATH": _module_the_test_user_can_read(), "PATH": "/usr/bin:/bin"},
        preexec_fn=drop,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def run(who: str, code: str, **kwargs) -> SandboxResult:
    """Run ``code`` in the sandbox started by the actor itself or by the unprivileged test user."""
    if who == "actor" or os.geteuid() != 0:
        return run_python(code, **kwargs)
    return SandboxResult(**_as_user(code=code, **kwargs)["result"])


def granted(who: str) -> dict:
    if who == "actor" or os.geteuid() != 0:
        return asdict(layers())
    return _as_user()["layers"]


def _kernel_or_skip(who: str, audit_hook: bool, *needed: str) -> None:
    """Kernel-only variants test a kernel layer alone; skip where this host does not grant it."""
    if audit_hook:
        return
    got = granted(who)
    have = set(got["namespaces"]) | ({"landlock"} if got["landlock_abi"] else set())
    have |= {"uid_drop"} if got["uid_drop"] else set()
    if not any(set(alternative) <= have for alternative in needed):
        pytest.skip(f"this host grants {got}; needs one of {needed}")


def test_the_sandbox_reports_the_layers_it_got():
    got = layers()
    assert got.audit_hook and got.pdeathsig and got.interpreter
    if os.geteuid() == 0:
        assert got.uid_drop, "a root actor must drop the program to a uid of its own"


@pytest.mark.parametrize("who", AS)
def test_a_program_runs_and_its_output_comes_back(who):
    result = run(who, "import sys\nprint(sum(map(int, sys.stdin.read().split())))", stdin="1 2 3")
    assert result.ok and result.stdout.strip() == "6"


def test_an_infinite_loop_is_killed_at_the_timeout():
    result = run_python("while True:\n    pass", timeout_s=1.0)
    assert result.timed_out and result.returncode is None and not result.ok


@pytest.mark.parametrize("who", AS)
@pytest.mark.parametrize("audit_hook", HOOK)
def test_a_connection_to_the_loopback_redis_is_blocked(who, audit_hook, redis_server):
    _kernel_or_skip(who, audit_hook, ("net",), ("landlock",))
    host, port = redis_server.broker.host, redis_server.port
    code = (
        "import socket\n"
        f"s = socket.create_connection(({host!r}, {port}), timeout=2)\n"
        "s.sendall(b'PING\\r\\n')\nprint('reply', s.recv(64))"
    )
    result = run(who, code, timeout_s=5, audit_hook=audit_hook)
    assert "reply" not in result.stdout and result.returncode not in (0, None)
    assert "Error" in result.stderr


@pytest.mark.parametrize("who", AS)
@pytest.mark.parametrize("audit_hook", HOOK)
def test_the_actors_environment_cannot_be_read_through_proc(who, audit_hook, monkeypatch):
    _kernel_or_skip(who, audit_hook, ("proc",), ("uid_drop",))
    monkeypatch.setenv("STREAMRL_TEST_SECRET", "hunter2")
    # The parent of the sandbox: this test process, or the test user's helper process.
    code = (
        "import os\nprint(os.environ.get('STREAMRL_TEST_SECRET'))\n"
        "for pid in [p for p in os.listdir('/proc') if p.isdigit()]:\n"
        "    try:\n        data = open(f'/proc/{pid}/environ', 'rb').read()\n"
        "    except OSError as e:\n        print('denied', e)\n        continue\n"
        "    if b'hunter2' in data:\n        print('leaked', pid)\n"
        f"try:\n    print(open('/proc/{os.getpid()}/environ', 'rb').read())\n"
        "except OSError as e:\n    print('denied', e)"
    )
    result = run(who, code, audit_hook=audit_hook)
    assert "hunter2" not in result.stdout + result.stderr and "leaked" not in result.stdout
    assert "denied" in result.stdout


@pytest.mark.parametrize("who", AS)
@pytest.mark.parametrize("audit_hook", HOOK)
def test_writes_outside_the_work_dir_fail_and_inside_succeed(who, audit_hook):
    _kernel_or_skip(who, audit_hook, ("landlock",), ("uid_drop",))
    # World-writable, so only the sandbox (not plain file permissions) can keep the write out.
    outside = Path(tempfile.mkdtemp(prefix="streamrl-outside-"))
    outside.chmod(0o777)
    target = outside / "escaped.txt"
    code = (
        "open('inside.txt', 'w').write('ok')\nprint(open('inside.txt').read())\n"
        f"open({str(target)!r}, 'w').write('escaped')"
    )
    try:
        result = run(who, code, audit_hook=audit_hook)
        assert result.stdout.strip() == "ok"
        assert "PermissionError" in result.stderr and not target.exists()
    finally:
        shutil.rmtree(outside)


# Each rebinds what the old hook read as globals of the boot script, then tries to get out.
TAMPERING = {
    "main_globals": (
        "import sys\nm = sys.modules['__main__']\n"
        "for name in ('_BLOCKED', '_PATHS', '_root', '_pid', '_WRITE'):\n"
        "    setattr(m, name, () if name.isupper() else '/')\n"
        "vars(m).update(_BLOCKED=(), _root='/', _pid=1)\n"
    ),
    "gc_walk": (
        "import gc\n"
        "for f in gc.get_objects():\n"
        "    if getattr(f, '__name__', '') == 'hook':\n"
        "        f.__defaults__ = None\n"
    ),
    "frame_walk": (
        "try:\n    open('/etc/x', 'w')\nexcept PermissionError as e:\n"
        "    frame = e.__traceback__.tb_next.tb_frame\n    frame.f_locals.clear()\n"
    ),
    "patched_os": (
        "import os, os.path, posixpath\n"
        "os.path.realpath = posixpath.realpath = lambda p, **k: os.getcwd()\n"
    ),
}


@pytest.mark.parametrize("who", AS)
@pytest.mark.parametrize("attack", sorted(TAMPERING))
def test_tampering_with_the_hook_does_not_open_the_sandbox(who, attack, redis_server):
    host, port = redis_server.broker.host, redis_server.port
    outside = Path(tempfile.mkdtemp(prefix="streamrl-outside-"))
    outside.chmod(0o777)
    target = outside / "escaped.txt"
    code = (
        "try:\n"
        + "".join(f"    {line}\n" for line in TAMPERING[attack].splitlines())
        + "except Exception as e:\n    print('tamper failed', type(e).__name__)\n"
        "import os, socket\n"
        "for attempt in (\n"
        f"    lambda: open({str(target)!r}, 'w').write('escaped'),\n"
        f"    lambda: os.system('echo escaped > {target}'),\n"
        f"    lambda: socket.create_connection(({host!r}, {port}), timeout=2),\n"
        "):\n"
        "    try:\n        attempt()\n        print('escaped')\n"
        "    except Exception as e:\n        print('contained', type(e).__name__)\n"
    )
    try:
        result = run(who, code, timeout_s=10)
        assert "escaped" not in result.stdout, result.stdout + result.stderr
        assert result.stdout.count("contained") == 3, result.stdout + result.stderr
        assert not target.exists()
    finally:
        shutil.rmtree(outside)


@pytest.mark.parametrize("who", AS)
@pytest.mark.parametrize("audit_hook", HOOK)
def test_ctypes_is_refused_or_contained(who, audit_hook):
    _kernel_or_skip(who, audit_hook, ("landlock",), ("uid_drop",))
    outside = Path(tempfile.mkdtemp(prefix="streamrl-outside-"))
    outside.chmod(0o777)
    target = outside / "escaped.txt"
    code = (
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        f"fd = libc.open({str(target).encode()!r}, 0o101, 0o644)\n"
        "print('fd', fd, ctypes.get_errno())\n"
    )
    try:
        result = run(who, code, audit_hook=audit_hook)
        assert not target.exists(), result.stdout
        if audit_hook:
            assert "PermissionError" in result.stderr
        else:
            assert result.stdout.startswith("fd -1")
    finally:
        shutil.rmtree(outside)


@pytest.mark.parametrize("who", AS)
@pytest.mark.parametrize("audit_hook", HOOK)
def test_a_fork_bomb_is_contained_and_the_next_program_runs(who, audit_hook):
    _kernel_or_skip(who, audit_hook, ("pid",), ("uid_drop",))
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
    result = run(who, bomb, timeout_s=2, audit_hook=audit_hook)
    assert not result.ok
    assert run(who, "print('still fine')").stdout.strip() == "still fine"


def test_memory_past_the_limit_fails_inside_the_program():
    result = run_python("x = bytearray(1 << 30)\nprint('allocated')", memory_mb=128)
    assert "MemoryError" in result.stderr and "allocated" not in result.stdout


def _marked(token: str) -> list[psutil.Process]:
    """Live processes whose command line carries ``token`` (zombies are dead already)."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        if token in " ".join(proc.info["cmdline"] or ()) and proc.info["status"] != "zombie":
            found.append(proc)
    return found


def _wait_gone(token: str, seconds: float = 10) -> list[psutil.Process]:
    deadline = time.monotonic() + seconds
    while (left := _marked(token)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


@pytest.mark.parametrize("audit_hook", HOOK)
def test_a_double_forked_grandchild_in_its_own_session_dies_with_the_timeout(audit_hook):
    _kernel_or_skip("actor", audit_hook, ("pid",), ("uid_drop",))
    token = f"streamrl-grandchild-{os.getpid()}-{time.monotonic_ns()}"
    escape = (
        "import os, sys\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        f"        os.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(120)', {token!r}])\n"
        "    os._exit(0)\n"
        "while True:\n    pass\n"
    )
    result = run_python(escape, timeout_s=2, audit_hook=audit_hook)
    assert result.timed_out or not result.ok
    if audit_hook:
        assert "PermissionError" in result.stderr
    assert not _wait_gone(token), "a grandchild survived the sandbox timeout"


def _sandbox_in_worker(code: str) -> None:
    run_python(code, timeout_s=120)


def test_a_killed_reward_worker_takes_its_sandbox_and_work_dir_with_it():
    """The reward pool SIGKILLs a worker at its own timeout, before run_python's cleanup runs."""
    token = f"streamrl-sleeper-{os.getpid()}-{time.monotonic_ns()}"
    code = f"import os, sys, time\nopen('marker-{token}', 'w').close()\ntime.sleep(120)\n"
    worker = multiprocessing.get_context("spawn").Process(target=_sandbox_in_worker, args=(code,))
    worker.start()
    workdirs = lambda: [  # noqa: E731
        p for p in Path(tempfile.gettempdir()).glob(f"{sandbox.WORKDIR_PREFIX}{worker.pid}-*")
    ]
    deadline = time.monotonic() + 60
    while not any((d / f"marker-{token}").exists() for d in workdirs()):
        assert time.monotonic() < deadline, "the sandboxed program never started"
        time.sleep(0.1)
    sandboxed = psutil.Process(worker.pid).children(recursive=True)
    assert sandboxed
    os.kill(worker.pid, signal.SIGKILL)
    worker.join()
    gone, alive = psutil.wait_procs(sandboxed, timeout=10)
    assert not [p for p in alive if p.status() != psutil.STATUS_ZOMBIE], alive
    assert run_python("print('next')").stdout.strip() == "next"
    assert not workdirs(), "the dead worker's work dir was not removed"


def test_a_work_dir_of_another_user_is_left_alone(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root to make a directory owned by another user")
    foreign = Path(tempfile.gettempdir()) / f"{sandbox.WORKDIR_PREFIX}999999999-foreign"
    foreign.mkdir()
    os.chown(foreign, _test_uid(), _test_uid())
    try:
        assert run_python("print('ok')").stdout.strip() == "ok"
        assert foreign.exists()
    finally:
        foreign.rmdir()
