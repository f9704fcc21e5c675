"""The second attack on the sandbox and the code reward (issue 26, holes 1, 5 and 6), each attack as
the issue describes it: programs that exit before their tests or go after the tests' proof of
completion, connections to pathname and abstract unix sockets, and the audit-hook bypasses
(``_posixsubprocess`` loaded through ``_imp``, a rebound ``os.fspath``/``_joinrealpath``, a
``dir_fd`` write, reading the process's own memory)."""

from __future__ import annotations

import shutil
import socket
import tempfile
import uuid
from pathlib import Path

import pytest
from test_actors_sandbox import AS, HOOK, _kernel_or_skip, granted, run

from streamrl.actors.rewards import code_execution

SOLUTION = "def add(a, b):\n    return a + b\n"
TESTS = "assert add(2, 3) == 5\nassert add(-1, 1) == 0\n"

# Programs that try to pass the tests without passing them. Each also defines a wrong add.
CHEATS = {
    "sys_exit": "import sys; sys.exit(0)",
    "os_exit": "import os; os._exit(0)",
    "raise_system_exit": "raise SystemExit",
    "atexit_exit_0": "import atexit, os\natexit.register(lambda: os._exit(0))\nraise SystemExit(1)",
    "closed_stdout": "import os, sys\nos.close(1)\nsys.exit(0)",
    # prints what a harness that trusts stdout might look for, read from its own files
    "echo_own_files": (
        "import glob, sys\nfor p in glob.glob('*'):\n    print(open(p).read())\nsys.exit(0)"
    ),
    # the nonce went over a pipe: read every descriptor the program could have inherited
    "read_every_fd": (
        "import os, sys\nfor fd in range(3, 256):\n    try:\n"
        "        print(os.read(fd, 4096))\n    except OSError:\n        pass\nsys.exit(0)"
    ),
    # from inside a call the tests make, walk to the tests' code object and print its constants
    "frame_walk_to_the_tests": (
        "import sys, os\n"
        "def add(a, b):\n"
        "    f = sys._getframe(1)\n"
        "    for c in f.f_code.co_consts:\n"
        "        if isinstance(c, bytes):\n            os.write(1, c)\n"
        "    os._exit(0)\n"
    ),
    # a trace function gets the tests' frame without asking: jump past every assert to the line
    # after them
    "trace_jump_past_the_asserts": (
        "import sys\n"
        "last = len(open('tests.py').read().splitlines()) + 1\n"
        "def tracer(frame, event, arg):\n"
        "    if event == 'line' and frame.f_code.co_filename.endswith('tests.py'):\n"
        "        if frame.f_lineno < last:\n            frame.f_lineno = last\n"
        "    return tracer\n"
        "sys.settrace(tracer)\n"
    ),
    # a signal handler receives the interrupted frame
    "signal_handler_frame": (
        "import signal, os\n"
        "def grab(sig, frame):\n"
        "    while frame is not None:\n"
        "        for c in frame.f_code.co_consts:\n"
        "            if isinstance(c, bytes):\n                os.write(1, c)\n"
        "        frame = frame.f_back\n"
        "    os._exit(0)\n"
        "signal.signal(signal.SIGALRM, grab)\nsignal.setitimer(signal.ITIMER_REAL, 0.01)\n"
        "def add(a, b):\n    import time; time.sleep(5)\n"
    ),
    "memory_scan": (
        "import re, os\n"
        "maps = open('/proc/self/maps').read().splitlines()\n"
        "mem = open('/proc/self/mem', 'rb')\n"
        "for line in maps:\n"
        "    lo, hi = (int(x, 16) for x in line.split()[0].split('-'))\n"
        "    try:\n        mem.seek(lo); blob = mem.read(hi - lo)\n    except OSError:\n        continue\n"
        "    for m in re.findall(rb'\\n[0-9a-f]{32}\\n', blob):\n        os.write(1, m)\n"
        "os._exit(0)\n"
    ),
}


def _completion(code: str) -> list[dict]:
    return [{"role": "assistant", "content": f"```python\n{code}\n```"}]


def test_a_solution_that_passes_its_tests_scores_1():
    assert code_execution(_completion(SOLUTION), TESTS) == 1.0
    # what the hook still lets through for ordinary code (dataclasses read __code__/__defaults__)
    typed = (
        "from dataclasses import dataclass\n@dataclass\nclass Pair:\n    a: int\n    b: int\n"
        "def add(a, b):\n    return Pair(a, b).a + Pair(a, b).b\n"
    )
    assert code_execution(_completion(typed), TESTS) == 1.0
    # output the program buffered after the tests, and a line of its own, do not hide the pass
    noisy = SOLUTION + "import atexit\natexit.register(print, 'bye')\nprint('hello', end='')"
    assert code_execution(_completion(noisy), TESTS) == 1.0


@pytest.mark.parametrize("cheat", sorted(CHEATS))
def test_a_program_that_does_not_run_its_tests_to_the_end_scores_0(cheat):
    code = "def add(a, b):\n    return 0\n" + CHEATS[cheat]
    assert code_execution(_completion(code), TESTS) == 0.0
    # also against tests that cannot pass at all (the reproduction)
    assert code_execution(_completion(CHEATS[cheat]), "assert False") == 0.0


def _unix_listener(address) -> socket.socket:
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(address)
    # never accepted while the program runs: a connection it made waits in the backlog
    server.listen(8)
    return server


def _connected(server: socket.socket) -> bool:
    server.setblocking(False)
    try:
        server.accept()[0].close()
    except BlockingIOError:
        return False
    return True


@pytest.mark.parametrize("who", AS)
@pytest.mark.parametrize("audit_hook", HOOK)
@pytest.mark.parametrize("kind", ["pathname", "abstract"])
def test_unix_sockets_outside_the_sandbox_cannot_be_reached(who, audit_hook, kind):
    """vLLM's front-end and engine core talk over ZMQ ipc:// sockets in the temp dir
    (VLLM_RPC_BASE_PATH), pickled under VLLM_ALLOW_INSECURE_SERIALIZATION: a world-writable
    pathname socket there, or an abstract one, is what the sandbox must not reach."""
    if not audit_hook and not (granted(who)["seccomp"] or kind == "abstract"):
        pytest.skip("no seccomp layer on this host: only the hook stops pathname sockets")
    _kernel_or_skip(who, audit_hook, ("landlock",))
    folder = Path(tempfile.mkdtemp(prefix="streamrl-unix-"))
    folder.chmod(0o777)
    path = folder / "engine.sock"
    address = str(path) if kind == "pathname" else f"\0streamrl-test-{uuid.uuid4().hex}"
    server = _unix_listener(address)
    if kind == "pathname":
        path.chmod(0o777)
    target = address if kind == "pathname" else "\\0" + address[1:]
    code = (
        "import socket\ns = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
        f"s.connect({target!r})\nprint('connected')"
    )
    try:
        result = run(who, code, audit_hook=audit_hook)
        assert "connected" not in result.stdout and not result.ok, result.stdout + result.stderr
        assert not _connected(server)
    finally:
        server.close()
        shutil.rmtree(folder)


BYPASSES = {
    # no audit event; a real /bin/sh before the seccomp filter
    "fork_exec_via_imp": (
        "import _imp, importlib.machinery as m, os\n"
        "ps = _imp.create_builtin(m.ModuleSpec('_posixsubprocess', m.BuiltinImporter))\n"
        "r, w = os.pipe()\n"
        "pid = ps.fork_exec([b'/bin/sh', b'-c', b'echo escaped > @TARGET@'], [b'/bin/sh'], True, "
        "(w,), None, None, -1, -1, -1, -1, -1, -1, r, w, True, False, -1, None, None, None, -1, "
        "None, False)\n"
        "print('forked', pid)"
    ),
    "rebound_fspath": (
        "import os, posixpath\n"
        "os.fspath = lambda p: os.getcwd() + '/x'\n"
        "posixpath._joinrealpath = lambda path, rest, strict, seen: (os.getcwd(), True)\n"
        "open('@TARGET@', 'w').write('escaped')"
    ),
    "dir_fd_write": (
        "import os\nd = os.open('@OUTSIDE@', os.O_RDONLY | os.O_DIRECTORY)\n"
        "fd = os.open('escaped.txt', os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=d)\n"
        "os.write(fd, b'escaped')"
    ),
    "dir_fd_mkdir": "import os\nd = os.open('@OUTSIDE@', os.O_RDONLY)\nos.mkdir('escaped.txt', dir_fd=d)",
}


@pytest.mark.parametrize("who", AS)
@pytest.mark.parametrize("bypass", sorted(BYPASSES))
def test_the_hook_bypasses_of_the_second_attack_are_closed(who, bypass):
    outside = Path(tempfile.mkdtemp(prefix="streamrl-outside-"))
    outside.chmod(0o777)
    target = outside / "escaped.txt"
    code = BYPASSES[bypass].replace("@TARGET@", str(target)).replace("@OUTSIDE@", str(outside))
    try:
        result = run(who, code, timeout_s=10)
        assert not target.exists(), result.stdout + result.stderr
        assert "forked" not in result.stdout and not result.ok
        if bypass != "fork_exec_via_imp":
            # the hook itself refused, not only Landlock behind it
            assert "sandbox:" in result.stderr, result.stderr
    finally:
        shutil.rmtree(outside)


@pytest.mark.parametrize("who", AS)
def test_the_program_cannot_read_its_own_memory(who):
    result = run(who, "open('/proc/self/mem', 'rb')\nprint('opened')")
    assert "opened" not in result.stdout and "sandbox:" in result.stderr


@pytest.mark.parametrize("who", AS)
def test_total_disk_use_is_capped_not_only_each_file(who):
    """The issue's 24 files of 8 MiB, without end: the count of the work dir stops it, long
    before the timeout (RLIMIT_FSIZE alone bounds one file)."""
    code = (
        "import os\ni = 0\nwhile True:\n"
        "    with open(f'f{i}', 'wb') as f:\n        f.write(os.urandom(8 << 20))\n    i += 1\n"
    )
    result = run(who, code, timeout_s=120, disk_mb=64)
    assert result.disk_exceeded and not result.timed_out and not result.ok


def test_a_folder_hidden_from_the_count_ends_the_program():
    """A non-root actor cannot list a folder its program made unreadable; root reads any, so this
    runs as the unprivileged test user when the suite is root."""
    code = "import os, time\nos.mkdir('hide')\nos.chmod('hide', 0)\ntime.sleep(60)\n"
    result = run("user", code, timeout_s=120)
    assert result.disk_exceeded and not result.timed_out
