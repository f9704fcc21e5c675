"""The code-execution sandbox: each containment layer, with and without the interpreter audit hook."""

from __future__ import annotations

import os
import socket
import time

import pytest

from actors.sandbox import _setup, run_python

LAYERS = [pytest.param(True, id="all_layers"), pytest.param(False, id="kernel_only")]


def _kernel_layers_or_skip(
    audit_hook: bool, need_netns: bool = False, need_nobody: bool = False
) -> None:
    _, nobody, netns = _setup()
    if not audit_hook and need_netns and not netns:
        pytest.skip(
            "this kernel refuses network namespaces here; only the audit hook blocks sockets"
        )
    if not audit_hook and need_nobody and not nobody:
        pytest.skip("the actor is not root (or no interpreter runs as nobody): no uid drop")


def test_a_program_runs_and_its_output_comes_back():
    result = run_python("import sys\nprint(sum(map(int, sys.stdin.read().split())))", stdin="1 2 3")
    assert result.ok and result.stdout.strip() == "6"


def test_an_infinite_loop_is_killed_at_the_timeout():
    start = time.monotonic()
    result = run_python("while True:\n    pass", timeout_s=1.0)
    assert result.timed_out and result.returncode is None and not result.ok
    assert time.monotonic() - start < 5


@pytest.mark.parametrize("audit_hook", LAYERS)
def test_a_network_connect_is_blocked(audit_hook):
    _kernel_layers_or_skip(audit_hook, need_netns=True)
    with socket.socket() as server:  # a real listener the sandbox would reach without isolation
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        code = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)\nprint('connected')"
        result = run_python(code, timeout_s=5, audit_hook=audit_hook)
    assert "connected" not in result.stdout and result.returncode not in (0, None)
    assert (
        "PermissionError" if audit_hook else "OSError"
    ) in result.stderr or "refused" in result.stderr


@pytest.mark.parametrize("audit_hook", LAYERS)
def test_a_secret_environment_variable_cannot_be_read(audit_hook, monkeypatch):
    _kernel_layers_or_skip(audit_hook, need_nobody=True)
    monkeypatch.setenv("STREAMRL_TEST_SECRET", "hunter2")
    code = (
        "import os\nprint(os.environ.get('STREAMRL_TEST_SECRET'))\n"
        f"try:\n    print(open('/proc/{os.getpid()}/environ', 'rb').read())\nexcept OSError as e:\n    print('denied', e)"
    )
    result = run_python(code, audit_hook=audit_hook)
    assert "hunter2" not in result.stdout + result.stderr
    assert "denied" in result.stdout


@pytest.mark.parametrize("audit_hook", LAYERS)
def test_writes_outside_the_temp_dir_fail_and_inside_succeed(audit_hook, tmp_path):
    _kernel_layers_or_skip(audit_hook, need_nobody=True)
    target = tmp_path / "escaped.txt"
    code = (
        "open('inside.txt', 'w').write('ok')\nprint(open('inside.txt').read())\n"
        f"open({str(target)!r}, 'w').write('escaped')"
    )
    result = run_python(code, audit_hook=audit_hook)
    assert result.stdout.strip() == "ok"
    assert "PermissionError" in result.stderr and not target.exists()


@pytest.mark.parametrize("audit_hook", LAYERS)
def test_a_fork_bomb_is_contained_and_the_next_program_runs(audit_hook):
    _kernel_layers_or_skip(audit_hook, need_nobody=True)
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
    start = time.monotonic()
    result = run_python(bomb, timeout_s=2, audit_hook=audit_hook)
    assert not result.ok and time.monotonic() - start < 10
    assert run_python("print('still fine')").stdout.strip() == "still fine"


def test_memory_past_the_limit_fails_inside_the_program():
    result = run_python("x = bytearray(1 << 30)\nprint('allocated')", memory_mb=128)
    assert "MemoryError" in result.stderr and "allocated" not in result.stdout


def _running(pid: int) -> bool:
    """Alive and not a zombie (a killed orphan stays a zombie where pid 1 does not reap)."""
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.parametrize("audit_hook", LAYERS)
def test_a_double_forked_grandchild_in_its_own_session_dies_with_the_timeout(audit_hook):
    _kernel_layers_or_skip(audit_hook, need_nobody=True)
    escape = (
        "import os, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"  # leaves the sandbox's process group, so killpg alone misses it
        "    if os.fork() == 0:\n"
        "        print('grandchild', os.getpid(), flush=True)\n"
        "        time.sleep(120)\n"
        "    os._exit(0)\n"
        "time.sleep(0.5)\n"
        "while True:\n    pass\n"
    )
    result = run_python(escape, timeout_s=2, audit_hook=audit_hook)
    assert result.timed_out or not result.ok
    if audit_hook:  # the hook refuses the fork itself
        assert "grandchild" not in result.stdout and "PermissionError" in result.stderr
        return
    pid = int(result.stdout.split()[1])
    deadline = time.monotonic() + 5
    while _running(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _running(pid), f"grandchild {pid} survived the sandbox timeout"
