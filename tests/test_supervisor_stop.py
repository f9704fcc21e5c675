"""A child that ignores SIGTERM is asked where it hung before it is killed: an actor's threads'
stacks land in its log (``runtime.stacks``, ``launch.supervisor.stop_child``)."""

from __future__ import annotations

import signal
import subprocess
import sys

from streamrl.launch.supervisor import Child, stop_child

STUCK = """
import signal, time
from streamrl.runtime.stacks import dump_stacks_on_request
dump_stacks_on_request()
signal.signal(signal.SIGTERM, signal.SIG_IGN)
def stuck_here():
    print("ready", flush=True)
    time.sleep(600)
stuck_here()
"""


def test_an_actor_that_ignores_sigterm_leaves_its_stacks_in_its_log_and_is_killed(tmp_path):
    log = tmp_path / "actor-a9.log"
    with open(log, "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-c", STUCK],
            stdout=subprocess.PIPE,
            stderr=err,
            start_new_session=True,
        )
    # the handlers are in place before the stop begins
    assert proc.stdout.readline() == b"ready\n"
    child = Child("a9", "actor", [], log, proc=proc)
    events: list[str] = []
    # the child never exits by itself, so the wait's length decides nothing
    stop_child(child, events.append, timeout=1.0)
    assert proc.returncode == -signal.SIGKILL and child.done
    stacks = log.read_text()
    assert "most recent call first" in stacks and "stuck_here" in stacks, stacks
    assert events == [
        f"a9 ignored SIGTERM for 1 s (its threads' stacks: {log}); killing its process group"
    ]
